package clients4;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * DefaultMQProducer's send paths against one topic: {@code n} sync, async and oneway sends, one batch of {@code n},
 * and {@code n} ordered sends through a MessageQueueSelector (order id {@code i % 4} picks the queue). Prints
 * {"sent": [...each acknowledged send...], "oneway": [bodies], "errors": [...]}.
 *
 * <p>With {@code acl=key:secret} it signs with AclClientRPCHook and, with {@code modes=sync}, sends only the sync
 * ones; a refused send is listed under "errors" with its response code.
 */
public final class Produce {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Common.args(argv);
        String topic = args.get("topic");
        int n = Integer.parseInt(args.getOrDefault("n", "8"));
        List<String> modes = List.of(args.getOrDefault("modes", "sync,async,oneway,batch,ordered").split(","));
        DefaultMQProducer producer = Common.configure(new DefaultMQProducer(args.get("group"), Common.hook(args)),
            args);
        producer.setRetryTimesWhenSendFailed(0);
        producer.start();
        List<Map<String, Object>> sent = Collections.synchronizedList(new ArrayList<>());
        List<Map<String, Object>> errors = Collections.synchronizedList(new ArrayList<>());
        List<String> oneway = new ArrayList<>();
        try {
            if (modes.contains("sync")) {
                for (int i = 0; i < n; i++) {
                    Message m = Common.message(topic, "sync", i);
                    try {
                        sent.add(withMode(Common.sent(producer.send(m), m), "sync"));
                    } catch (Exception e) {
                        errors.add(Common.error(e));
                    }
                }
            }
            if (modes.contains("async")) {
                CountDownLatch done = new CountDownLatch(n);
                for (int i = 0; i < n; i++) {
                    Message m = Common.message(topic, "async", i);
                    producer.send(m, new SendCallback() {
                        @Override
                        public void onSuccess(SendResult r) {
                            sent.add(withMode(Common.sent(r, m), "async"));
                            done.countDown();
                        }

                        @Override
                        public void onException(Throwable e) {
                            errors.add(Common.error(e));
                            done.countDown();
                        }
                    });
                }
                if (!done.await(60, TimeUnit.SECONDS)) {
                    errors.add(Map.of("message", "async sends unanswered after 60 s"));
                }
            }
            if (modes.contains("oneway")) {
                for (int i = 0; i < n; i++) {
                    Message m = Common.message(topic, "oneway", i);
                    producer.sendOneway(m);
                    oneway.add("oneway-" + i);
                }
            }
            if (modes.contains("batch")) {
                List<Message> batch = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    batch.add(Common.message(topic, "batch", i));
                }
                SendResult r = producer.send(batch);
                Map<String, Object> one = withMode(Common.sent(r, batch.get(0)), "batch");
                one.remove("body");
                sent.add(one);
            }
            if (modes.contains("ordered")) {
                for (int i = 0; i < n; i++) {
                    Message m = Common.message(topic, "ordered", i);
                    SendResult r = producer.send(m, (mqs, msg, orderId) -> mqs.get((Integer) orderId % mqs.size()), i % 4);
                    Map<String, Object> one = withMode(Common.sent(r, m), "ordered");
                    one.put("orderId", i % 4);
                    sent.add(one);
                }
            }
        } finally {
            producer.shutdown();
        }
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("sent", sent);
        doc.put("oneway", oneway);
        doc.put("errors", errors);
        Common.print(doc);
    }

    private static Map<String, Object> withMode(Map<String, Object> m, String mode) {
        m.put("mode", mode);
        return m;
    }
}
