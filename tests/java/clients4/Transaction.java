package clients4;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * TransactionMQProducer with a check-back: {@code n} messages each of "commit", "rollback" and "unknown" (the local
 * transaction answers COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW); the check-back commits the unknown ones. A push
 * consumer reads the topic until the {@code 2n} committed messages arrived and its offsets are at the end.
 * Prints {"sent": [...with localTransactionState, transactionId...], "checks": [...], "received": [...],
 * "caughtUp": bool}.
 */
public final class Transaction {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Common.args(argv);
        String topic = args.get("topic");
        int n = Integer.parseInt(args.get("n"));
        List<Map<String, Object>> checks = Collections.synchronizedList(new ArrayList<>());
        TransactionMQProducer producer = Common.configure(new TransactionMQProducer(args.get("group") + "_P"), args);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                switch (msg.getUserProperty("mode")) {
                    case "commit":
                        return LocalTransactionState.COMMIT_MESSAGE;
                    case "rollback":
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    default:
                        return LocalTransactionState.UNKNOW;
                }
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Map<String, Object> one = Common.received(msg);
                one.put("transactionId", msg.getTransactionId());
                checks.add(one);
                return msg.getUserProperty("mode").equals("unknown") ? LocalTransactionState.COMMIT_MESSAGE
                    : LocalTransactionState.ROLLBACK_MESSAGE;
            }
        });
        producer.start();
        List<Map<String, Object>> sent = new ArrayList<>();
        for (String mode : List.of("commit", "rollback", "unknown")) {
            for (int i = 0; i < n; i++) {
                Message m = Common.message(topic, mode, i);
                TransactionSendResult r = producer.sendMessageInTransaction(m, null);
                Map<String, Object> one = Common.sent(r, m);
                one.put("localTransactionState", r.getLocalTransactionState().name());
                one.put("transactionId", r.getTransactionId());
                sent.add(one);
            }
        }

        List<Map<String, Object>> received = Collections.synchronizedList(new ArrayList<>());
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(args.get("group"), null,
            new AllocateMessageQueueAveragely());
        Common.configure(c, args);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            received.addAll(Common.receivedAll(msgs));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        boolean done = Common.await(() -> received.size() >= 2 * n && checks.size() >= n, 120);
        c.shutdown();
        producer.shutdown();
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("sent", sent);
        doc.put("checks", checks);
        doc.put("received", received);
        doc.put("done", done);
        Common.print(doc);
    }
}
