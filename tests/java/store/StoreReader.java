import com.alibaba.fastjson.JSON;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Reads a whole topic back through a broker with RocketMQ's 4.x pull consumer, then looks messages up by key.
 *
 * Arguments: namesrvAddr topic key... Prints one JSON document on stdout:
 * {"messages": [...every message of every queue, in queue order...], "byKey": {key: [msgId...]}}.
 * A queue is read from its min to its max offset; any status other than FOUND before the max offset is an error.
 */
public class StoreReader {
    static Map<String, Object> describe(MessageExt m) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("topic", m.getTopic());
        out.put("queueId", m.getQueueId());
        out.put("queueOffset", m.getQueueOffset());
        out.put("commitLogOffset", m.getCommitLogOffset());
        out.put("msgId", m.getMsgId());
        out.put("offsetMsgId", ((MessageClientExt) m).getOffsetMsgId());  // store host + offset, from the record
        out.put("body", Base64.getEncoder().encodeToString(m.getBody()));
        out.put("bodyCRC", m.getBodyCRC());
        out.put("properties", new TreeMap<>(m.getProperties()));
        out.put("bornTimestamp", m.getBornTimestamp());
        out.put("storeTimestamp", m.getStoreTimestamp());
        out.put("sysFlag", m.getSysFlag());
        out.put("flag", m.getFlag());
        return out;
    }

    public static void main(String[] args) throws Exception {
        PrintStream result = System.out;
        System.setOut(System.err);  // the client's own logging goes to the console: stdout carries only the JSON
        String namesrv = args[0], topic = args[1];
        DefaultMQPullConsumer consumer = new DefaultMQPullConsumer("peer_store_reader");
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("peer_store_reader_" + System.nanoTime());
        consumer.start();
        try {
            List<MessageQueue> queues = new ArrayList<>(consumer.fetchSubscribeMessageQueues(topic));
            queues.sort((a, b) -> Integer.compare(a.getQueueId(), b.getQueueId()));
            List<Object> messages = new ArrayList<>();
            for (MessageQueue mq : queues) {
                long offset = consumer.minOffset(mq), max = consumer.maxOffset(mq);
                while (offset < max) {
                    PullResult r = consumer.pullBlockIfNotFound(mq, "*", offset, 32);
                    if (r.getPullStatus() != PullStatus.FOUND) {
                        throw new IllegalStateException(mq + " at " + offset + " of " + max + ": " + r.getPullStatus());
                    }
                    for (MessageExt m : r.getMsgFoundList()) {
                        messages.add(describe(m));
                    }
                    offset = r.getNextBeginOffset();
                }
            }
            Map<String, Object> byKey = new LinkedHashMap<>();
            for (int i = 2; i < args.length; i++) {
                QueryResult q = consumer.queryMessage(topic, args[i], 64, 0, Long.MAX_VALUE);
                List<String> ids = new ArrayList<>();
                for (MessageExt m : q.getMessageList()) {
                    ids.add(m.getMsgId());
                }
                byKey.put(args[i], ids);
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("messages", messages);
            out.put("byKey", byKey);
            result.println(JSON.toJSONString(out));
        } finally {
            consumer.shutdown();
        }
    }
}
