import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;
import org.apache.rocketmq.client.java.impl.producer.SendReceiptImpl;
import org.apache.rocketmq.client.java.message.MessageViewImpl;

/**
 * Apache RocketMQ's 5.x Java client (rocketmq-client-java) against one gRPC endpoint, every message path in one JVM:
 * a Producer (normal bodies of every length 0..64 bytes and one of 4 MiB; FIFO; delay; transactional commit,
 * rollback and an open one its checker commits, the checker answering as the producer decided), SimpleConsumers (one group per path) and a PushConsumer.
 * The client's body-digest check is on (it always is): a message it finds corrupted is marked (SimpleConsumer) or
 * never reaches the listener (PushConsumer).
 *
 * Arguments: key=value pairs (endpoint, normal, fifo, delay, tx topics; sgroup, fgroup, dgroup, tgroup, pgroup;
 * preloaded: how many messages the normal topic held before, which its consumers receive too).
 * Prints one JSON document: what was sent (message id, queue, offset; the refusals), and for each consumer every
 * message received (id, topic, queue, offset, tag, keys, group, properties, attempt, body as hex or its size and
 * MD5 when larger than 64 bytes, corrupted).
 */
public final class Client5Messages {
    static final int BIG = 4 * 1024 * 1024;
    static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (String kv : argv) {
            int eq = kv.indexOf('=');
            a.put(kv.substring(0, eq), kv.substring(eq + 1));
        }
        ClientConfiguration config = ClientConfiguration.newBuilder().setEndpoints(a.get("endpoint"))
            .enableSsl(false).setRequestTimeout(Duration.ofSeconds(20)).build();
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> checked = Collections.synchronizedList(new ArrayList<>());
        String normal = a.get("normal"), fifo = a.get("fifo"), delay = a.get("delay"), tx = a.get("tx");
        Producer producer = PROVIDER.newProducerBuilder().setClientConfiguration(config)
            .setTopics(normal, fifo, delay, tx)
            .setTransactionChecker(view -> {  // as an application's checker: what its own transaction decided
                checked.add(view.getMessageId().toString());
                return "rollback".equals(view.getProperties().get("how")) ? TransactionResolution.ROLLBACK
                    : TransactionResolution.COMMIT;
            }).build();
        try {
            // normal: bodies of every length 0..64 and one of 4 MiB; an empty body is refused by the endpoint
            List<Object> sent = new ArrayList<>();
            List<Object> refused = new ArrayList<>();
            for (int n = 0; n <= 65; n++) {
                byte[] body = n == 65 ? pattern(BIG, n) : pattern(n, n);
                try {  // the client itself refuses an empty body
                    Message m = message(normal, body).setTag("TagA").setKeys("k-" + n, "common")
                        .addProperty("len", Integer.toString(body.length)).build();
                    sent.add(receipt(producer.send(m), body.length));
                } catch (Exception e) {
                    refused.add(mapOf("len", body.length, "error", String.valueOf(e.getMessage())));
                }
            }
            out.put("normal_sent", sent);
            out.put("normal_refused", refused);
            int stored = sent.size() + Integer.parseInt(a.getOrDefault("preloaded", "0"));
            out.put("simple", receive(config, a.get("sgroup"), normal, stored, 60));

            // FIFO: one message group, delivered in order
            List<Object> fifoSent = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                byte[] body = ("fifo-" + i).getBytes(StandardCharsets.UTF_8);
                fifoSent.add(receipt(producer.send(message(fifo, body).setMessageGroup("order-1")
                    .addProperty("index", Integer.toString(i)).build()), body.length));
            }
            out.put("fifo_sent", fifoSent);
            out.put("fifo", receive(config, a.get("fgroup"), fifo, 5, 60));

            // delay: received only once its delivery time has come; one sent before it (same time, same queue)
            // is recalled and never received
            long deliverAt = System.currentTimeMillis() + 2000;
            byte[] rbody = "recalled".getBytes(StandardCharsets.UTF_8);
            SendReceipt toRecall = producer.send(message(delay, rbody).setDeliveryTimestamp(deliverAt).build());
            byte[] dbody = "delayed".getBytes(StandardCharsets.UTF_8);
            out.put("delay_sent", receipt(producer.send(message(delay, dbody).setDeliveryTimestamp(deliverAt)
                .build()), dbody.length));
            out.put("recall_sent", receipt(toRecall, rbody.length));
            out.put("recalled", producer.recallMessage(delay, toRecall.getRecallHandle()).getMessageId().toString());
            out.put("delay_deliver_at", deliverAt);
            out.put("delay", receive(config, a.get("dgroup"), delay, 1, 60));

            // transactions: committed, rolled back, and one left open for the broker's check-back to commit
            Map<String, Object> txSent = new LinkedHashMap<>();
            for (String how : new String[] {"commit", "rollback", "check"}) {
                Transaction t = producer.beginTransaction();
                byte[] body = ("tx-" + how).getBytes(StandardCharsets.UTF_8);
                SendReceipt r = producer.send(message(tx, body).addProperty("how", how).build(), t);
                if (how.equals("commit")) {
                    t.commit();
                } else if (how.equals("rollback")) {
                    t.rollback();
                }
                txSent.put(how, receipt(r, body.length));
            }
            out.put("tx_sent", txSent);
            // the committed and the checked one; then a while longer for a third, which must not come
            out.put("tx", receive(config, a.get("tgroup"), tx, 2, 60));
            out.put("tx_after", receive(config, a.get("tgroup"), tx, 1, 4));
            out.put("tx_checked", new ArrayList<>(checked));
        } finally {
            producer.close();
        }
        // PushConsumer: every normal message reaches the listener (a corrupted one would be discarded)
        int stored = ((List<?>) out.get("normal_sent")).size() + Integer.parseInt(a.getOrDefault("preloaded", "0"));
        out.put("push", push(config, a.get("pgroup"), normal, stored, 60));
        System.out.println(json(out));
        System.exit(0);
    }

    static MessageBuilder message(String topic, byte[] body) {
        return PROVIDER.newMessageBuilder().setTopic(topic).setBody(body);
    }

    /** Bytes of every value, shifted by seed, so two bodies of one length differ and every byte value occurs. */
    static byte[] pattern(int len, int seed) {
        byte[] b = new byte[len];
        for (int i = 0; i < len; i++) {
            b[i] = (byte) (i * 31 + seed * 7);
        }
        return b;
    }

    static Map<String, Object> receipt(SendReceipt r, int len) {
        SendReceiptImpl impl = (SendReceiptImpl) r;
        return mapOf("message_id", r.getMessageId().toString(), "queue", impl.getMessageQueue().getQueueId(),
            "offset", impl.getOffset(), "transaction_id", impl.getTransactionId(), "len", len);
    }

    /** Receive until ``expect`` messages came or ``seconds`` passed; ack each. */
    static Map<String, Object> receive(ClientConfiguration config, String group, String topic, int expect,
        int seconds) throws Exception {
        SimpleConsumer consumer = PROVIDER.newSimpleConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(2))
            .setSubscriptionExpressions(Collections.singletonMap(topic, new FilterExpression("*",
                FilterExpressionType.TAG))).build();
        List<Object> got = new ArrayList<>();
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        try {
            while (got.size() < expect && System.nanoTime() < end) {
                for (MessageView v : consumer.receive(Math.min(32, expect - got.size()), Duration.ofSeconds(30))) {
                    Map<String, Object> m = view(v);
                    m.put("received_at", System.currentTimeMillis());
                    got.add(m);
                    consumer.ack(v);
                }
            }
        } finally {
            consumer.close();
        }
        return mapOf("received", got);
    }

    static Map<String, Object> push(ClientConfiguration config, String group, String topic, int expect,
        int seconds) throws Exception {
        ConcurrentLinkedQueue<Object> got = new ConcurrentLinkedQueue<>();
        CountDownLatch all = new CountDownLatch(expect);
        PushConsumer consumer = PROVIDER.newPushConsumerBuilder().setClientConfiguration(config)
            .setConsumerGroup(group)
            .setSubscriptionExpressions(Collections.singletonMap(topic, new FilterExpression("*",
                FilterExpressionType.TAG)))
            .setMessageListener(v -> {
                got.add(view(v));
                all.countDown();
                return ConsumeResult.SUCCESS;
            }).build();
        try {
            all.await(seconds, TimeUnit.SECONDS);
        } finally {
            consumer.close();
        }
        return mapOf("received", new ArrayList<>(got));
    }

    static Map<String, Object> view(MessageView v) {
        MessageViewImpl impl = (MessageViewImpl) v;
        ByteBuffer buf = v.getBody().duplicate();
        byte[] body = new byte[buf.remaining()];
        buf.get(body);
        Map<String, Object> m = mapOf("message_id", v.getMessageId().toString(), "topic", v.getTopic(),
            "queue", impl.getMessageQueue().getQueueId(), "offset", impl.getOffset(),
            "tag", v.getTag().orElse(null), "keys", new ArrayList<>(new java.util.TreeSet<>(v.getKeys())),
            "group", v.getMessageGroup().orElse(null), "properties", new TreeMap<>(v.getProperties()),
            "attempt", v.getDeliveryAttempt(), "delivery_timestamp", v.getDeliveryTimestamp().orElse(null),
            "len", body.length, "md5", md5(body), "corrupted", impl.isCorrupted());
        if (body.length <= 64) {
            m.put("hex", hex(body));
        }
        return m;
    }

    static String md5(byte[] body) {
        try {
            return hex(MessageDigest.getInstance("MD5").digest(body));
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) {
            s.append(String.format("%02x", x & 0xFF));
        }
        return s.toString();
    }

    static Map<String, Object> mapOf(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    static String json(Object o) {
        if (o == null) {
            return "null";
        }
        if (o instanceof Number || o instanceof Boolean) {
            return o.toString();
        }
        if (o instanceof Map) {
            StringBuilder s = new StringBuilder("{");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (s.length() > 1) {
                    s.append(',');
                }
                s.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return s.append('}').toString();
        }
        if (o instanceof Iterable) {
            StringBuilder s = new StringBuilder("[");
            for (Object x : (Iterable<?>) o) {
                if (s.length() > 1) {
                    s.append(',');
                }
                s.append(json(x));
            }
            return s.append(']').toString();
        }
        StringBuilder s = new StringBuilder("\"");
        for (char c : o.toString().toCharArray()) {
            if (c == '"' || c == '\\') {
                s.append('\\').append(c);
            } else if (c < 0x20) {
                s.append(String.format("\\u%04x", (int) c));
            } else {
                s.append(c);
            }
        }
        return s.append('"').toString();
    }
}
