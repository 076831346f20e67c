package clients4;

import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Sends {@code n} messages, then reads them with DefaultLitePullConsumer twice:
 * <ul>
 * <li>assign: every queue assigned, queue 0 sought to {@code seek}, the others to their beginning; polled until
 * {@code expectAssign} messages, then offsets committed (commitSync);</li>
 * <li>subscribe: a second group subscribed with the tag expression {@code tags}, from the first offset, polled
 * until {@code expectSubscribe} messages.</li>
 * </ul>
 * Prints {"sent": [...], "queues": [queue ids], "assign": [...], "subscribe": [...]}.
 */
public final class LitePull {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Common.args(argv);
        String topic = args.get("topic");
        int n = Integer.parseInt(args.get("n"));
        List<Map<String, Object>> sent = new ArrayList<>();
        DefaultMQProducer producer = Common.configure(new DefaultMQProducer(args.get("group") + "_P"), args);
        producer.start();
        try {
            for (int i = 0; i < n; i++) {
                Message m = Common.message(topic, "lite", i);
                sent.add(Common.sent(producer.send(m), m));
            }
        } finally {
            producer.shutdown();
        }

        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("sent", sent);
        DefaultLitePullConsumer assign = Common.configure(new DefaultLitePullConsumer(args.get("group") + "_assign"),
            args);
        assign.setAutoCommit(false);
        assign.start();
        try {
            Collection<MessageQueue> mqs = assign.fetchMessageQueues(topic);
            List<Integer> ids = new ArrayList<>();
            mqs.forEach(mq -> ids.add(mq.getQueueId()));
            doc.put("queues", ids);
            assign.assign(mqs);
            for (MessageQueue mq : mqs) {
                if (mq.getQueueId() == 0) {
                    assign.seek(mq, Long.parseLong(args.get("seek")));
                } else {
                    assign.seekToBegin(mq);
                }
            }
            doc.put("assign", poll(assign, Integer.parseInt(args.get("expectAssign"))));
            assign.commitSync();
        } finally {
            assign.shutdown();
        }

        DefaultLitePullConsumer subscribe = Common.configure(
            new DefaultLitePullConsumer(args.get("group") + "_subscribe"), args);
        subscribe.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        subscribe.subscribe(topic, args.get("tags"));
        subscribe.start();
        try {
            doc.put("subscribe", poll(subscribe, Integer.parseInt(args.get("expectSubscribe"))));
        } finally {
            subscribe.shutdown();
        }
        Common.print(doc);
    }

    /** Polls until {@code expect} messages arrived, then once more (a duplicate or an extra one would show). */
    private static List<Map<String, Object>> poll(DefaultLitePullConsumer c, int expect) {
        List<Map<String, Object>> got = new ArrayList<>();
        long end = System.nanoTime() + 120_000_000_000L;
        while (got.size() < expect && System.nanoTime() < end) {
            got.addAll(Common.receivedAll(c.poll(1000)));
        }
        got.addAll(Common.receivedAll(c.poll(500)));
        return got;
    }
}
