import com.alibaba.fastjson.JSON;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.UtilAll;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExtBrokerInner;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.PutMessageStatus;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * CommitLog records and ConsumeQueue units written by Apache RocketMQ 5.4.0's DefaultMessageStore: a topic
 * longer than 127 bytes (stored with the V2 magic and a two-byte topic length, which 4.x cannot write) beside a
 * short one. Argument: a scratch directory. Prints one JSON document, the same shape as StoreVectors' records.
 */
public class StoreVectors5 {
    static final int SEGMENT = 64 * 1024, CQ_FILE = 20 * 50;

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);  // a failure must end the JVM too, whose store threads would keep it alive
        }
        System.exit(0);
    }

    static void run(String[] args) throws Exception {
        PrintStream result = System.out;
        System.setOut(System.err);  // the store's own logging goes to the console: stdout carries only the JSON
        Path storeRoot = Path.of(args[0]);
        MessageStoreConfig cfg = new MessageStoreConfig();
        cfg.setStorePathRootDir(storeRoot.toString());
        cfg.setStorePathCommitLog(storeRoot.resolve("commitlog").toString());
        cfg.setMappedFileSizeCommitLog(SEGMENT);
        cfg.setMappedFileSizeConsumeQueue(CQ_FILE);
        cfg.setMaxHashSlotNum(64);
        cfg.setMaxIndexNum(256);
        cfg.setHaListenPort(0);  // the store starts an HA listener: on the OS's pick, not 10912 (may be taken)
        BrokerConfig broker = new BrokerConfig();
        DefaultMessageStore store = new DefaultMessageStore(cfg, new BrokerStatsManager("DefaultCluster", true), null,
                                                            broker, new ConcurrentHashMap<>());
        if (!store.load()) {
            throw new IllegalStateException("store load");
        }
        store.start();
        String longTopic = "Long" + "x".repeat(150);
        List<Map<String, Object>> records = new ArrayList<>();
        Object[][] cases = {{"v2_long_topic", longTopic, 2, "long topic body", "tagL", "kL"},
                            {"v1_short_topic", "Short5", 0, "short", "TopicTest", "kS1 kS2"}};
        long begin = 1_700_000_000_000L;
        for (Object[] c : cases) {
            MessageExtBrokerInner m = new MessageExtBrokerInner();
            m.setTopic((String) c[1]);
            m.setQueueId((Integer) c[2]);
            m.setBody(((String) c[3]).getBytes(StandardCharsets.UTF_8));
            Map<String, String> p = new LinkedHashMap<>();
            p.put("TAGS", (String) c[4]);
            p.put("KEYS", (String) c[5]);
            MessageAccessor.setProperties(m, p);
            m.setPropertiesString(MessageDecoder.messageProperties2String(p));
            m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode((String) c[4]));
            m.setBornTimestamp(begin + records.size());
            m.setBornHost(new InetSocketAddress("10.0.0.1", 40000 + records.size()));
            m.setStoreHost(new InetSocketAddress("10.0.0.2", 10911));
            PutMessageResult r = store.putMessage(m);
            if (r.getPutMessageStatus() != PutMessageStatus.PUT_OK) {
                throw new IllegalStateException(c[0] + ": " + r);
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("name", c[0]);
            out.put("topic", c[1]);
            out.put("queue_id", c[2]);
            out.put("body", c[3]);
            out.put("properties", m.getPropertiesString());
            out.put("tags_code", m.getTagsCode());
            out.put("flag", 0);
            out.put("sys_flag", m.getSysFlag());
            out.put("born_timestamp", m.getBornTimestamp());
            out.put("born_host", List.of("10.0.0.1", 40000 + records.size()));
            out.put("store_host", List.of("10.0.0.2", 10911));
            out.put("store_timestamp", r.getAppendMessageResult().getStoreTimestamp());
            out.put("reconsume_times", 0);
            out.put("queue_offset", r.getAppendMessageResult().getLogicsOffset());
            out.put("physical_offset", r.getAppendMessageResult().getWroteOffset());
            out.put("size", r.getAppendMessageResult().getWroteBytes());
            records.add(out);
        }
        while (store.dispatchBehindBytes() > 0) {
            Thread.onSpinWait();  // the ConsumeQueue is written by the store's reput thread
        }
        store.shutdown();
        byte[] log = Files.readAllBytes(storeRoot.resolve("commitlog").resolve(UtilAll.offset2FileName(0)));
        for (Map<String, Object> r : records) {
            int at = (int) (long) (Long) r.get("physical_offset");
            r.put("hex", hex(Arrays.copyOfRange(log, at, at + (Integer) r.get("size"))));
            byte[] cq = Files.readAllBytes(storeRoot.resolve("consumequeue").resolve((String) r.get("topic"))
                .resolve(String.valueOf(r.get("queue_id"))).resolve(UtilAll.offset2FileName(0)));
            int unit = 20 * (int) (long) (Long) r.get("queue_offset");
            r.put("cq_unit", hex(Arrays.copyOfRange(cq, unit, unit + 20)));
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("records", records);
        result.println(JSON.toJSONString(out));
        result.flush();
    }
}
