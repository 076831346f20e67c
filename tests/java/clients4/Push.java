package clients4;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/**
 * Sends {@code n} messages to {@code topic}, then consumes them with DefaultMQPushConsumer in one {@code mode}:
 * <ul>
 * <li>concurrent: one clustering consumer;</li>
 * <li>orderly: MessageListenerOrderly, the sends spread by a selector (order id {@code i % 4} picks the queue);</li>
 * <li>broadcast: two consumers of one group (instances "a" and "b"), MessageModel.BROADCASTING;</li>
 * <li>retry: the listener answers RECONSUME_LATER every time, {@code maxReconsumeTimes} retries, then the DLQ;</li>
 * <li>sql: a SQL92 selector {@code sql}; every message carries the properties {@code a} (= i) and {@code color}.</li>
 * <li>any other name: as concurrent, the name only naming the messages (their bodies are {@code <mode>-<i>}).</li>
 * </ul>
 * It stops once {@code expect} deliveries arrived and each consumer's offsets reached the end of every queue it
 * owns (retry topic included), so a late duplicate or a lost offset commit shows. Prints {"sent": [...],
 * "consumers": {instance: [deliveries in arrival order]}, "caughtUp": bool}.
 */
public final class Push {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Common.args(argv);
        String topic = args.get("topic");
        String mode = args.get("mode");
        int n = Integer.parseInt(args.get("n"));
        int expect = Integer.parseInt(args.get("expect"));

        List<Map<String, Object>> sent = new ArrayList<>();
        DefaultMQProducer producer = Common.configure(new DefaultMQProducer(args.get("group") + "_P",
            Common.hook(args)), args);
        producer.start();
        try {
            for (int i = 0; i < n; i++) {
                Message m = Common.message(topic, mode, i);
                m.putUserProperty("a", Integer.toString(i));
                m.putUserProperty("color", i % 2 == 0 ? "red" : "blue");
                if (mode.equals("orderly")) {
                    m.putUserProperty("orderId", Integer.toString(i % 4));
                    sent.add(Common.sent(producer.send(m, (mqs, msg, id) -> mqs.get((Integer) id % mqs.size()), i % 4),
                        m));
                } else {
                    sent.add(Common.sent(producer.send(m), m));
                }
            }
        } finally {
            producer.shutdown();
        }

        List<String> instances = mode.equals("broadcast") ? List.of("a", "b") : List.of("a");
        Map<String, List<Map<String, Object>>> deliveries = new LinkedHashMap<>();
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        int[] total = {0};
        for (String instance : instances) {
            List<Map<String, Object>> got = Collections.synchronizedList(new ArrayList<>());
            deliveries.put(instance, got);
            DefaultMQPushConsumer c = new DefaultMQPushConsumer(args.get("group"), Common.hook(args),
                new AllocateMessageQueueAveragely());
            Common.configure(c, args);
            c.setInstanceName(instance);
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.setMaxReconsumeTimes(Integer.parseInt(args.getOrDefault("maxReconsumeTimes", "16")));
            if (mode.equals("broadcast")) {
                c.setMessageModel(MessageModel.BROADCASTING);
            }
            if (mode.equals("sql")) {
                c.subscribe(topic, MessageSelector.bySql(args.get("sql")));
            } else {
                c.subscribe(topic, "*");
            }
            if (mode.equals("orderly")) {
                c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                    record(got, msgs, total);
                    return ConsumeOrderlyStatus.SUCCESS;
                });
            } else {
                boolean later = mode.equals("retry");
                c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                    record(got, msgs, total);
                    return later ? ConsumeConcurrentlyStatus.RECONSUME_LATER
                        : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                });
            }
            c.start();
            consumers.add(c);
        }
        boolean delivered = Common.await(() -> count(total) >= expect, 120);
        boolean caughtUp = delivered && Common.await(() -> consumers.stream().allMatch(Push::caughtUp), 60);
        for (DefaultMQPushConsumer c : consumers) {
            c.shutdown();
        }
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("sent", sent);
        doc.put("consumers", deliveries);
        doc.put("caughtUp", caughtUp);
        Common.print(doc);
    }

    private static void record(List<Map<String, Object>> got, List<MessageExt> msgs, int[] total) {
        for (MessageExt m : msgs) {
            Map<String, Object> one = Common.received(m);
            one.put("thread", Thread.currentThread().getName());
            got.add(one);
        }
        synchronized (total) {
            total[0] += msgs.size();
        }
    }

    private static int count(int[] total) {
        synchronized (total) {
            return total[0];
        }
    }

    /** Every queue the consumer owns has its consumed offset (in memory) at the queue's max offset. */
    private static boolean caughtUp(DefaultMQPushConsumer c) {
        Set<MessageQueue> owned = c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable().keySet();
        if (owned.isEmpty()) {
            return false;
        }
        try {
            for (MessageQueue mq : owned) {
                long done = c.getDefaultMQPushConsumerImpl().getOffsetStore().readOffset(mq,
                    ReadOffsetType.READ_FROM_MEMORY);
                if (done != c.maxOffset(mq)) {
                    return false;
                }
            }
            return true;
        } catch (Exception e) {
            return false;
        }
    }
}
