import com.alibaba.fastjson.JSON;
import java.io.File;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TimeZone;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.UtilAll;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.PutMessageStatus;
import org.apache.rocketmq.store.StoreCheckpoint;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.index.IndexFile;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Test vectors computed by Apache RocketMQ's own classes (the 4.9.7 store and common jars), for mqlake's codecs.
 *
 * Argument: a scratch directory. The program runs a real DefaultMessageStore there (CommitLog records written by
 * its own CommitLog from MessageExtBrokerInner, ConsumeQueue units written by its own dispatch), an IndexFile and
 * a StoreCheckpoint of their own classes, and calls UtilAll, MessageDecoder, MessageClientIDSetter and
 * MessageExtBrokerInner for the pure rules. It prints one JSON document: the inputs and what RocketMQ made of them
 * (bytes as hex).
 */
public class StoreVectors {
    static final int SEGMENT = 64 * 1024, CQ_FILE = 20 * 50, SLOTS = 64, ENTRIES = 256;

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    static final String[] STRINGS = {
        "", "a", "TopicTest", "TopicTest#key-1", "polygenelubricants", "GydZG_", "DESIGN_DOC#KEY",
        "\u00e9t\u00e9", "\u4e2d\u6587\u952e", "\ud83d\ude00 emoji", "tag-0", "||", "a b c",
        "k".repeat(300), "\u00e9\u4e2d".repeat(150),  // longer than 256 UTF-16 units, ASCII and not
    };

    /** Per time zone (Calendar.getInstance() takes the default one): the month MessageClientIDSetter counts the
     * UNIQ_KEY time field from (its own setStartTime, called by reflection with a chosen instant), and the
     * IndexFile name UtilAll.timeMillisToHumanString gives that instant. */
    static List<Object> localTime() throws Exception {
        Object[][] cases = {
            {"UTC", 1795320580000L},                 // 2026-11-22T04:09:40Z
            {"UTC", 1795867200000L},                 // 2026-11-28T12:00:00Z, > 2^31 ms after the month start
            {"UTC", 1798761599999L},                 // the last ms of a 31-day month
            {"UTC", 1769904000000L},                 // 2026-02-01T00:00:00.000Z, exactly the month start
            {"Asia/Shanghai", 1796054400000L},       // Dec 1 00:00 local
            {"Asia/Shanghai", 1796054399999L},       // one ms earlier: still November local
            // daylight saving time at dates whose rules no later tz database revises
            {"America/New_York", 1679270400000L},    // month started in EST, now EDT
            {"America/New_York", 1698714000000L},    // Oct 30 21:00 EDT
            {"Australia/Lord_Howe", 1680307200000L}, // half-hour DST zone
            {"Asia/Kolkata", 1767225600000L},
            {"Asia/Amman", 1460678400000L},          // local midnight of Apr 1 2016 did not exist
            {"America/Havana", 1605398400000L},      // local midnight of Nov 1 2020 happened twice
        };
        Method set = MessageClientIDSetter.class.getDeclaredMethod("setStartTime", long.class);
        Field start = MessageClientIDSetter.class.getDeclaredField("startTime");
        Field next = MessageClientIDSetter.class.getDeclaredField("nextStartTime");
        set.setAccessible(true);
        start.setAccessible(true);
        next.setAccessible(true);
        TimeZone saved = TimeZone.getDefault();
        List<Object> out = new ArrayList<>();
        try {
            for (Object[] c : cases) {
                TimeZone.setDefault(TimeZone.getTimeZone((String) c[0]));
                long now = (Long) c[1];
                set.invoke(null, now);
                out.add(map("tz", c[0], "now_ms", now, "month_start_ms", start.getLong(null),
                            "next_month_start_ms", next.getLong(null), "human", UtilAll.timeMillisToHumanString(now)));
            }
        } finally {
            TimeZone.setDefault(saved);
            set.invoke(null, System.currentTimeMillis());
        }
        return out;
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
        Path root = Path.of(args[0]);
        Map<String, Object> out = new LinkedHashMap<>();

        // -- pure rules ------------------------------------------------------------------------------------------
        IndexFile hasher = new IndexFile(root.resolve("00000000000000000001").toString(), SLOTS, ENTRIES, 0, 0);
        List<Object> strings = new ArrayList<>();
        for (String s : STRINGS) {
            strings.add(map("s", s, "hash", s.hashCode(), "index_key_hash", hasher.indexKeyHashMethod(s),
                            "tags_code", MessageExtBrokerInner.tagsString2tagsCode(s)));
        }
        hasher.destroy(0);
        out.put("strings", strings);
        List<Object> crcs = new ArrayList<>();
        for (String s : new String[] {"", "123456789", "body-1;", "\u00ff\u0000binary"}) {
            byte[] b = s.getBytes(StandardCharsets.ISO_8859_1);
            crcs.add(map("hex", hex(b), "crc32", UtilAll.crc32(b)));
        }
        out.put("crc32", crcs);
        List<Object> names = new ArrayList<>();
        for (long off : new long[] {0L, 1024L, 1L << 30, Long.MAX_VALUE}) {
            names.add(map("offset", off, "name", UtilAll.offset2FileName(off)));
        }
        out.put("offset_file_names", names);
        List<Object> ids = new ArrayList<>();
        for (Object[] host : new Object[][] {{"10.0.0.2", 10911, 1024L}, {"127.0.0.1", 1, 0L},
                                            {"::1", 10911, 1L << 40}, {"fe80::1:2", 65535, 7L}}) {
            InetSocketAddress addr = new InetSocketAddress((String) host[0], (Integer) host[1]);
            ids.add(map("host", host[0], "port", host[1], "offset", host[2],
                        "id", MessageDecoder.createMessageId(addr, (Long) host[2])));
        }
        out.put("offset_msg_ids", ids);
        Map<String, String> props = new LinkedHashMap<>();
        props.put("KEYS", "k1 k2");
        props.put("TAGS", "tagA");
        props.put("UNIQ_KEY", "0A0000011F90ABCD0000000000000001");
        props.put("\u00e9", "\u4e2d");
        List<Object> parsed = new ArrayList<>();
        for (String text : new String[] {"KEYS\u0001k1 k2\u0002TAGS\u0001tagA\u0002", "KEYS\u0001k1 k2\u0002TAGS\u0001tagA",
                                          "a\u0001\u0002b\u00011", "\u00012\u0002c\u0001x\u0001y", "noseparator", ""}) {
            parsed.add(map("input", text, "map", MessageDecoder.string2messageProperties(text)));
        }
        out.put("properties", map("map", props, "serialized", MessageDecoder.messageProperties2String(props),
                                  "parsed", parsed));
        List<Object> uniq = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            String id = MessageClientIDSetter.createUniqID();
            uniq.add(map("id", id, "ip", MessageClientIDSetter.getIPStrFromID(id),
                         "time_ms", MessageClientIDSetter.getNearlyTimeFromID(id).getTime()));
        }
        out.put("uniq_ids", uniq);
        out.put("local_time", localTime());

        // -- IndexFile and StoreCheckpoint, by their own classes ---------------------------------------------------
        Path indexPath = root.resolve("00000000000000000002");  // MappedFile reads a number off the name
        IndexFile index = new IndexFile(indexPath.toString(), SLOTS, ENTRIES, 0, 0);
        List<Object> keys = new ArrayList<>();
        long begin = 1_700_000_000_000L;
        String[] indexKeys = {"TopicTest#k1", "TopicTest#k2", "TopicTest#k1", "Other#\u4e2d", "TopicTest#GydZG_"};
        for (int i = 0; i < indexKeys.length; i++) {
            long phy = 1024L * (i + 1), ts = begin + 1000L * i;
            if (!index.putKey(indexKeys[i], phy, ts)) {
                throw new IllegalStateException("putKey " + indexKeys[i]);
            }
            keys.add(map("key", indexKeys[i], "phy_offset", phy, "store_timestamp", ts));
        }
        index.flush();
        out.put("index", map("hash_slot_num", SLOTS, "index_num", ENTRIES, "puts", keys,
                             "hex", hex(Files.readAllBytes(indexPath))));
        Path cpPath = root.resolve("checkpoint");
        StoreCheckpoint cp = new StoreCheckpoint(cpPath.toString());
        cp.setPhysicMsgTimestamp(1_700_000_000_123L);
        cp.setLogicsMsgTimestamp(1_700_000_000_456L);
        cp.setIndexMsgTimestamp(1_700_000_000_789L);
        cp.flush();
        cp.shutdown();
        out.put("checkpoint", map("physic_msg_timestamp", 1_700_000_000_123L, "logics_msg_timestamp",
                                  1_700_000_000_456L, "index_msg_timestamp", 1_700_000_000_789L,
                                  "hex", hex(Arrays.copyOf(Files.readAllBytes(cpPath), 24))));

        // -- CommitLog records and ConsumeQueue units, by a running DefaultMessageStore --------------------------
        MessageStoreConfig cfg = new MessageStoreConfig();
        Path storeRoot = root.resolve("store");
        cfg.setStorePathRootDir(storeRoot.toString());
        cfg.setStorePathCommitLog(storeRoot.resolve("commitlog").toString());
        cfg.setMappedFileSizeCommitLog(SEGMENT);
        cfg.setMappedFileSizeConsumeQueue(CQ_FILE);
        cfg.setMaxHashSlotNum(SLOTS);
        cfg.setMaxIndexNum(ENTRIES);
        cfg.setHaListenPort(0);  // the store starts an HA listener: on the OS's pick, not 10912 (may be taken)
        DefaultMessageStore store = new DefaultMessageStore(cfg, new BrokerStatsManager("DefaultCluster", true), null,
                                                            new BrokerConfig());
        if (!store.load()) {
            throw new IllegalStateException("store load");
        }
        store.start();
        List<Object> records = new ArrayList<>();
        Object[][] cases = {
            // name, topic, queue, body, tags, keys, born host, store host, flag, reconsume
            {"ipv4", "TopicTest", 3, "hello, store", "tagA", "k1 k2", "10.0.0.1", "10.0.0.2", 7, 0},
            {"ipv6_born", "TopicTest", 0, "\u4e2d\u6587 body", "TopicTest", "k3", "::1", "10.0.0.2", 0, 2},
            {"ipv6_both", "T6", 1, "x", "t", null, "fe80::1:2", "::1", 0, 0},
            {"no_properties", "Bare", 0, "", null, null, "127.0.0.1", "127.0.0.1", 0, 0},
        };
        for (Object[] c : cases) {
            MessageExtBrokerInner m = new MessageExtBrokerInner();
            m.setTopic((String) c[1]);
            m.setQueueId((Integer) c[2]);
            m.setBody(((String) c[3]).getBytes(StandardCharsets.UTF_8));
            Map<String, String> p = new LinkedHashMap<>();
            if (c[4] != null) {
                p.put("TAGS", (String) c[4]);
            }
            if (c[5] != null) {
                p.put("KEYS", (String) c[5]);
            }
            m.setPropertiesString(MessageDecoder.messageProperties2String(p));
            m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode((String) c[4]));
            m.setBornTimestamp(begin + records.size());
            m.setBornHost(new InetSocketAddress((String) c[6], 40000 + records.size()));
            m.setStoreHost(new InetSocketAddress((String) c[7], 10911));
            m.setFlag((Integer) c[8]);
            m.setReconsumeTimes((Integer) c[9]);
            PutMessageResult r = store.putMessage(m);
            if (r.getPutMessageStatus() != PutMessageStatus.PUT_OK) {
                throw new IllegalStateException(c[0] + ": " + r);
            }
            records.add(map("name", c[0], "topic", c[1], "queue_id", c[2], "body", c[3], "properties",
                            m.getPropertiesString(), "tags_code", m.getTagsCode(), "flag", c[8],
                            "sys_flag", m.getSysFlag(), "born_timestamp", m.getBornTimestamp(),
                            "born_host", List.of(c[6], 40000 + records.size()), "store_host", List.of(c[7], 10911),
                            "store_timestamp", r.getAppendMessageResult().getStoreTimestamp(),
                            "reconsume_times", c[9], "queue_offset", m.getQueueOffset(),
                            "physical_offset", r.getAppendMessageResult().getWroteOffset(),
                            "size", r.getAppendMessageResult().getWroteBytes()));
        }
        // a message that does not fit in what is left of the first segment: the store ends it with a BLANK record
        long blankAt = 0;
        for (Object o : records) {
            @SuppressWarnings("unchecked") Map<String, Object> r = (Map<String, Object>) o;
            blankAt = Math.max(blankAt, (Long) r.get("physical_offset") + (Integer) r.get("size"));
        }
        MessageExtBrokerInner big = new MessageExtBrokerInner();
        big.setTopic("Big");
        big.setBody(new byte[SEGMENT - (int) blankAt]);
        big.setPropertiesString("");
        big.setBornHost(new InetSocketAddress("127.0.0.1", 1));
        big.setStoreHost(new InetSocketAddress("127.0.0.1", 10911));
        if (store.putMessage(big).getPutMessageStatus() != PutMessageStatus.PUT_OK) {
            throw new IllegalStateException("the message past the first segment");
        }
        List<Object> delays = new ArrayList<>();
        for (int level = 1; level <= 18; level++) {
            delays.add(map("level", level, "store_timestamp", begin, "deliver_timestamp",
                           store.getScheduleMessageService().computeDeliverTimestamp(level, begin)));
        }
        out.put("delay_levels", map("levels", cfg.getMessageDelayLevel(), "deliver", delays));
        while (store.dispatchBehindBytes() > 0) {
            Thread.onSpinWait();  // the ConsumeQueue is written by the store's reput thread
        }
        out.put("format", FormatVectors.build(root.resolve("format"), store));
        store.shutdown();
        byte[] log = Files.readAllBytes(storeRoot.resolve("commitlog").resolve(UtilAll.offset2FileName(0)));
        for (Object o : records) {
            @SuppressWarnings("unchecked") Map<String, Object> r = (Map<String, Object>) o;
            int at = (int) (long) (Long) r.get("physical_offset");
            r.put("hex", hex(Arrays.copyOfRange(log, at, at + (Integer) r.get("size"))));
        }
        out.put("records", records);
        out.put("blank", map("position", blankAt, "hex", hex(Arrays.copyOfRange(log, (int) blankAt, (int) blankAt + 8))));
        for (Object o : records) {  // each record's ConsumeQueue unit, as the store's dispatch wrote it
            @SuppressWarnings("unchecked") Map<String, Object> r = (Map<String, Object>) o;
            byte[] cq = Files.readAllBytes(storeRoot.resolve("consumequeue").resolve((String) r.get("topic"))
                .resolve(String.valueOf(r.get("queue_id"))).resolve(UtilAll.offset2FileName(0)));
            int at = 20 * (int) (long) (Long) r.get("queue_offset");
            r.put("cq_unit", hex(Arrays.copyOfRange(cq, at, at + 20)));
        }
        out.put("commitlog_segment", SEGMENT);
        result.println(JSON.toJSONString(out));
        result.flush();
    }
}
