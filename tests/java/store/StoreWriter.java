import com.alibaba.fastjson.JSON;
import java.nio.charset.StandardCharsets;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageBatch;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Writes a topic through a broker with RocketMQ's 4.x producer: ``count`` single sends spread over the topic's
 * queues, then one batch of ``batch`` messages into queue 0. Message i has body "body-i" (repeated i % 7 + 1
 * times), keys "key-i" and "shared", tags "tag-(i % 3)" and the user property "seq" = i.
 *
 * The queues are named (``brokerName``, queue ids 0-3) rather than looked up: the topic does not exist yet, and the
 * broker creates it with 4 queues on the first send (autoCreateTopicEnable).
 *
 * Arguments: namesrvAddr topic brokerName count batch. Prints one JSON document on stdout: {"sent": [{msgId, offsetMsgId,
 * queueId, queueOffset, seq}...]}; a send that is not SEND_OK is an error.
 */
public class StoreWriter {
    static Message message(String topic, int i) {
        StringBuilder body = new StringBuilder();
        for (int r = 0; r <= i % 7; r++) {
            body.append("body-").append(i).append(';');
        }
        Message m = new Message(topic, "tag-" + (i % 3), "key-" + i + " shared",
                                body.toString().getBytes(StandardCharsets.UTF_8));
        m.putUserProperty("seq", Integer.toString(i));
        return m;
    }

    static Map<String, Object> row(SendResult r, String msgId, String offsetMsgId, long queueOffset, int seq) {
        if (r.getSendStatus() != SendStatus.SEND_OK) {
            throw new IllegalStateException("message " + seq + ": " + r);
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("seq", seq);
        out.put("msgId", msgId);
        out.put("offsetMsgId", offsetMsgId);
        out.put("queueId", r.getMessageQueue().getQueueId());
        out.put("queueOffset", queueOffset);
        return out;
    }

    public static void main(String[] args) throws Exception {
        PrintStream result = System.out;
        System.setOut(System.err);  // the client's own logging goes to the console: stdout carries only the JSON
        String namesrv = args[0], topic = args[1];
        int count = Integer.parseInt(args[3]), batch = Integer.parseInt(args[4]);
        DefaultMQProducer producer = new DefaultMQProducer("peer_store_writer");
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("peer_store_writer_" + System.nanoTime());
        producer.setDefaultTopicQueueNums(4);
        producer.setSendMsgTimeout(60_000);  // a broker's first send creates the topic: slow on a busy test machine
        producer.start();
        try {
            List<MessageQueue> queues = new ArrayList<>();
            for (int q = 0; q < 4; q++) {
                queues.add(new MessageQueue(topic, args[2], q));
            }
            List<Object> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                SendResult r = producer.send(message(topic, i), queues.get(i % queues.size()));
                sent.add(row(r, r.getMsgId(), r.getOffsetMsgId(), r.getQueueOffset(), i));
            }
            List<Message> msgs = new ArrayList<>();
            for (int i = count; i < count + batch; i++) {
                msgs.add(message(topic, i));
            }
            SendResult r = producer.send(msgs, queues.get(0));
            String[] ids = r.getMsgId().split(","), offsetIds = r.getOffsetMsgId().split(",");
            for (int j = 0; j < batch; j++) {
                sent.add(row(r, ids[j], offsetIds[j], r.getQueueOffset() + j, count + j));
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("sent", sent);
            result.println(JSON.toJSONString(out));
        } finally {
            producer.shutdown();
        }
    }
}
