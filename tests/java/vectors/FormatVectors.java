import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.InetSocketAddress;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TimeZone;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.zip.CRC32;
import org.apache.rocketmq.common.UtilAll;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.store.ConsumeQueue;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.StoreCheckpoint;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.index.IndexFile;
import org.apache.rocketmq.store.index.IndexHeader;

/**
 * Edge-case vectors for the codec details tests/test_rocketmq_vectors.py checks, each computed by RocketMQ's own
 * classes (4.9.7 common and store) from inputs chosen here: extreme values, surrogate pairs and a lone surrogate,
 * IPv6 hosts, a committed transaction, a chained IndexFile entry, a UNIQ_KEY counter about to wrap and time
 * fields past 2^31 ms. StoreVectors prints them under "format".
 */
final class FormatVectors {
    static final int SALT = 0x9ABCDEF0;  // a negative int: the class-loader hash MessageClientIDSetter puts in IDs

    private FormatVectors() {
    }

    /** UTF-16 code units as hex: JSON cannot carry a lone surrogate, so strings travel this way. */
    static String utf16(String s) {
        StringBuilder sb = new StringBuilder();
        for (char c : s.toCharArray()) {
            sb.append(String.format("%04x", (int) c));
        }
        return sb.toString();
    }

    static Object stringHashes() {
        StringBuilder longAscii = new StringBuilder();
        StringBuilder longCjk = new StringBuilder();
        for (int i = 0; i < 300; i++) {
            longAscii.append((char) ('a' + (i * 7) % 26));
            longCjk.append((char) (0x4E00 + (i * 37) % 2000));
        }
        String[] strings = {
            "", "a", "hello", "TopicTest", "TopicTest#KEY1", longAscii.toString(), "\u4E2D\u6587\u4E3B\u9898",
            "\u6D88\u606F#\u952E", "\uD83D\uDE00", "a\uD83D\uDE00b", "\uD834\uDD1Emusic",
            "polygenelubricants",  // hashCode == Integer.MIN_VALUE
            "tagA", "TagB", "TopicTest#k1", "TopicTest#k2", "\uD800",  // a lone high surrogate: still a Java String
            longCjk.toString(),
        };
        List<Object> out = new ArrayList<>();
        for (String s : strings) {
            out.add(StoreVectors.map("utf16", utf16(s), "utf16_units", s.length(), "hash", s.hashCode(),
                                     "math_abs", Math.abs(s.hashCode()), "index_key_hash", hasher.indexKeyHashMethod(s),
                                     "tags_code", MessageExtBrokerInner.tagsString2tagsCode(s)));
        }
        return out;
    }

    static IndexFile hasher;  // indexKeyHashMethod is an instance method

    static Object crc32() {
        byte[] pattern = new byte[1024];
        for (int i = 0; i < pattern.length; i++) {
            pattern[i] = (byte) ((i * 31 + 7) & 0xFF);
        }
        byte[] all = new byte[256];
        for (int i = 0; i < 256; i++) {
            all[i] = (byte) i;
        }
        Object[][] inputs = {
            {"empty", new byte[0]}, {"hello", "hello".getBytes(StandardCharsets.US_ASCII)},
            {"check_123456789", "123456789".getBytes(StandardCharsets.US_ASCII)},
            {"pattern_1KiB_(i*31+7)&0xFF", pattern}, {"bytes_0_to_255", all},
            {"hello world", "hello world".getBytes(StandardCharsets.US_ASCII)},
        };
        List<Object> out = new ArrayList<>();
        for (Object[] c : inputs) {
            byte[] data = (byte[]) c[1];
            CRC32 crc = new CRC32();
            crc.update(data, 0, data.length);
            out.add(StoreVectors.map("name", c[0], "hex", StoreVectors.hex(data), "crc32", crc.getValue(),
                                     "masked", UtilAll.crc32(data)));
        }
        return out;
    }

    /** CommitLog records with chosen offsets and timestamps, encoded by MessageDecoder.encode. */
    static Object records() throws Exception {
        Object[][] cases = {
            // name, born ip, born port, store ip, topic, queue, flag, queue offset, physical offset, sys flag,
            // store timestamp, reconsume, prepared tx offset, body, properties
            {"ipv4", "10.0.0.1", 1234, "10.0.0.2", "TopicTest", 3, 7, 42L, 1024L, 0, 1700000000123L, 1, 0L,
             "hello world", new String[] {"KEYS", "k1 k2", "TAGS", "tagA"}},
            {"ipv6_store", "10.0.0.1", 1234, "2001:db8::2", "TopicTest", 3, 7, 42L, 1024L, 0, 1700000000123L, 1, 0L,
             "hello world", new String[] {"KEYS", "k1 k2", "TAGS", "tagA"}},
            {"ipv6_both", "fe80::1", 40000, "2001:db8::2", "TopicTest", 0, 0, 0L, 2048L, 0, 1700000000123L, 0, 0L,
             "", new String[] {"KEYS", "k1 k2", "TAGS", "tagA"}},
            {"committed_tx_utf8", "10.0.0.1", 1234, "10.0.0.2", "\u4E2D\u6587\u4E3B\u9898", 1, 0, 9L, 4096L, 0x8,
             1700000000456L, 0, 1024L, "\u6D88\u606F",
             new String[] {"TAGS", "\u6807\u7B7E", "UNIQ_KEY", "0A0000010000000000000000000000"}},
        };
        List<Object> out = new ArrayList<>();
        for (Object[] c : cases) {
            MessageExt m = new MessageExt();
            byte[] body = ((String) c[13]).getBytes(StandardCharsets.UTF_8);
            m.setTopic((String) c[4]);
            m.setQueueId((Integer) c[5]);
            m.setFlag((Integer) c[6]);
            m.setQueueOffset((Long) c[7]);
            m.setCommitLogOffset((Long) c[8]);
            m.setSysFlag((Integer) c[9]);
            m.setBornTimestamp(1700000000000L);
            m.setBornHost(new InetSocketAddress((String) c[1], (Integer) c[2]));
            m.setStoreTimestamp((Long) c[10]);
            m.setStoreHost(new InetSocketAddress((String) c[3], 10911));
            if (((InetSocketAddress) m.getBornHost()).getAddress().getAddress().length == 16) {
                m.setBornHostV6Flag();
            }
            if (((InetSocketAddress) m.getStoreHost()).getAddress().getAddress().length == 16) {
                m.setStoreHostAddressV6Flag();
            }
            m.setReconsumeTimes((Integer) c[11]);
            m.setPreparedTransactionOffset((Long) c[12]);
            m.setBody(body);
            m.setBodyCRC(UtilAll.crc32(body));
            Map<String, String> props = new LinkedHashMap<>();
            String[] kv = (String[]) c[14];
            for (int i = 0; i < kv.length; i += 2) {
                props.put(kv[i], kv[i + 1]);
            }
            MessageAccessor.setProperties(m, props);
            byte[] raw = MessageDecoder.encode(m, false);
            MessageExt back = MessageDecoder.decode(java.nio.ByteBuffer.wrap(raw), true, false);
            byte[] backBody = back == null || back.getBody() == null ? new byte[0] : back.getBody();  // none when empty
            if (back == null || !Arrays.equals(backBody, body) || back.getCommitLogOffset() != (Long) c[8]) {
                throw new IllegalStateException("MessageDecoder does not read back " + c[0]);
            }
            out.add(StoreVectors.map("name", c[0], "magic", java.nio.ByteBuffer.wrap(raw).getInt(4),
                "born_host", List.of(c[1], c[2]), "store_host", List.of(c[3], 10911), "topic", c[4], "queue_id", c[5],
                "flag", c[6], "queue_offset", c[7], "physical_offset", c[8], "sys_flag", m.getSysFlag(),
                "born_timestamp", 1700000000000L, "store_timestamp", c[10], "reconsume_times", c[11],
                "prepared_transaction_offset", c[12], "body", c[13],
                "properties", MessageDecoder.messageProperties2String(props), "body_crc", m.getBodyCRC(),
                "total_size", raw.length, "hex", StoreVectors.hex(raw)));
        }
        return out;
    }

    static Object offsetMsgIds() {
        Object[][] hosts = {{"10.0.0.2", 10911, 1024L}, {"192.168.255.254", 65535, Long.MAX_VALUE},
                            {"2001:db8::2", 10911, 1073741824L}};
        List<Object> out = new ArrayList<>();
        for (Object[] h : hosts) {
            String id = MessageDecoder.createMessageId(new InetSocketAddress((String) h[0], (Integer) h[1]), (Long) h[2]);
            out.add(StoreVectors.map("host", List.of(h[0], h[1]), "offset", h[2], "id", id));
        }
        return out;
    }

    static Object propertiesParse() {
        String[] inputs = {
            "KEYS\u0001k1 k2\u0002TAGS\u0001tagA\u0002",
            "KEYS\u0001k1 k2\u0002TAGS\u0001tagA",                 // no trailing separator
            "a\u0001b\u0002",                                       // shortest legal segment
            "ab\u0002a\u0001\u0002\u0001b\u0002TAGS\u0001x\u0002",  // short, empty value, missing key
            "k\u0001v\u0001w\u0002",                                // value keeps a later 0x01
            "noseparator\u0002K\u0001V\u0002",                      // segment without 0x01
            "\u0002\u0002K\u0001V\u0002\u0002",                     // empty segments
            "K\u0001first\u0002K\u0001second\u0002",                // duplicate key: last wins
            "\u4E2D\u0001\uD83D\uDE00\u0002",                       // non-ASCII key and value
        };
        List<Object> out = new ArrayList<>();
        for (String s : inputs) {
            out.add(StoreVectors.map("input", s, "map", new TreeMap<>(MessageDecoder.string2messageProperties(s))));
        }
        return out;
    }

    static Object propertiesSerialize() {
        Map<String, String> pm = new LinkedHashMap<>();
        pm.put("KEYS", "k1 k2");
        pm.put("TAGS", "tagA");
        pm.put("NULLVAL", null);  // a null value is left out
        pm.put("UNIQ_KEY", "ABC");
        String s = MessageDecoder.messageProperties2String(pm);
        return StoreVectors.map("entries", List.of(List.of("KEYS", "k1 k2"), List.of("TAGS", "tagA"),
                                                   List.of("UNIQ_KEY", "ABC")),
                                "null_key", "NULLVAL", "string", s,
                                "utf8_hex", StoreVectors.hex(s.getBytes(StandardCharsets.UTF_8)));
    }

    /** Units at the edges of their fields, each written by ConsumeQueue.putMessagePositionInfo into its own queue
     * (the method skips a unit whose end is not past the queue's last one). */
    static Object cqUnits(DefaultMessageStore store) throws Exception {
        long[][] inputs = {
            {1024L, 200, MessageExtBrokerInner.tagsString2tagsCode("tagA")},
            {1024L, 200, MessageExtBrokerInner.tagsString2tagsCode("TopicTest#KEY1")},
            {0L, Integer.MAX_VALUE, 0L},
            {Long.MAX_VALUE - 1, 1, MessageExtBrokerInner.tagsString2tagsCode("polygenelubricants")},
        };
        Method put = ConsumeQueue.class.getDeclaredMethod("putMessagePositionInfo", long.class, int.class,
                                                          long.class, long.class);
        put.setAccessible(true);
        List<Object> out = new ArrayList<>();
        for (int q = 0; q < inputs.length; q++) {
            long[] c = inputs[q];
            ConsumeQueue cq = store.findConsumeQueue("Units", q);
            if (!(Boolean) put.invoke(cq, c[0], (int) c[1], c[2], 0L)) {
                throw new IllegalStateException("putMessagePositionInfo " + q);
            }
            cq.flush(0);
            Path file = Path.of(store.getMessageStoreConfig().getStorePathRootDir(), "consumequeue", "Units",
                                String.valueOf(q), UtilAll.offset2FileName(0));
            out.add(StoreVectors.map("offset", c[0], "size", (int) c[1], "tags_code", c[2],
                                     "hex", StoreVectors.hex(Arrays.copyOf(Files.readAllBytes(file), 20))));
        }
        return out;
    }

    /** One key put three times: the third entry chains to the second, 100 s after the file's first put. */
    static void index(Path root, Map<String, Object> out) throws Exception {
        int slots = 8, entries = 16;
        Path path = root.resolve("00000000000000000003");
        IndexFile index = new IndexFile(path.toString(), slots, entries, 0, 0);
        String key = "TopicTest#KEY1";
        long begin = 1700000000000L;
        long[][] puts = {{1L, begin}, {2L, begin + 1000}, {1024L, begin + 100_000}, {987654321L, begin + 100_000}};
        String[] keys = {key, key, key, "TopicTest#k2"};
        for (int i = 0; i < puts.length; i++) {
            if (!index.putKey(keys[i], puts[i][0], puts[i][1])) {
                throw new IllegalStateException("putKey " + i);
            }
        }
        index.flush();
        Field hf = IndexFile.class.getDeclaredField("indexHeader");
        hf.setAccessible(true);
        IndexHeader h = (IndexHeader) hf.get(index);
        byte[] file = Files.readAllBytes(path);
        int hashSlotSize = staticInt(IndexFile.class, "hashSlotSize"), indexSize = staticInt(IndexFile.class, "indexSize");
        int third = IndexHeader.INDEX_HEADER_SIZE + slots * hashSlotSize + 3 * indexSize;
        out.put("index_header", StoreVectors.map("begin_timestamp", h.getBeginTimestamp(),
            "end_timestamp", h.getEndTimestamp(), "begin_phy_offset", h.getBeginPhyOffset(),
            "end_phy_offset", h.getEndPhyOffset(), "hash_slot_count", h.getHashSlotCount().get(),
            "index_count", h.getIndexCount(),
            "hex", StoreVectors.hex(Arrays.copyOf(file, IndexHeader.INDEX_HEADER_SIZE))));
        out.put("index_entry", StoreVectors.map("key", key, "key_hash", index.indexKeyHashMethod(key),
            "phy_offset", 1024L, "time_diff", 100, "prev_index", 2, "hash_slot_num", slots, "index_num", entries,
            "position", third, "hex", StoreVectors.hex(Arrays.copyOfRange(file, third, third + indexSize))));
        index.destroy(0);
        MessageStoreConfig defaults = new MessageStoreConfig();
        out.put("index_file_size_default", IndexHeader.INDEX_HEADER_SIZE
            + (long) defaults.getMaxHashSlotNum() * hashSlotSize + (long) defaults.getMaxIndexNum() * indexSize);
        out.put("index_defaults", List.of(defaults.getMaxHashSlotNum(), defaults.getMaxIndexNum()));
    }

    static int staticInt(Class<?> c, String name) throws Exception {
        Field f = c.getDeclaredField(name);
        f.setAccessible(true);
        return f.getInt(null);
    }

    static Object checkpoint(Path root) throws Exception {
        Path path = root.resolve("checkpoint-format");
        StoreCheckpoint cp = new StoreCheckpoint(path.toString());
        cp.setPhysicMsgTimestamp(1700000000123L);
        cp.setLogicsMsgTimestamp(1700000000100L);
        cp.setIndexMsgTimestamp(1699999999000L);
        cp.flush();
        cp.shutdown();
        return StoreVectors.map("physic", 1700000000123L, "logics", 1700000000100L, "index", 1699999999000L,
                                "hex", StoreVectors.hex(Arrays.copyOf(Files.readAllBytes(path), 24)),
                                "file_size", Files.size(path));
    }

    static Object offsetFileNames() {
        List<Object> out = new ArrayList<>();
        for (long off : new long[] {0L, 1073741824L, 6000000L, 1234567890123L, Long.MAX_VALUE}) {
            out.add(StoreVectors.map("offset", off, "name", UtilAll.offset2FileName(off)));
        }
        return out;
    }

    /**
     * Per time zone: the month start setStartTime computes for a chosen instant, and the last 12 hex digits of an ID
     * createUniqID makes with its clock that far into the month and its counter at a chosen value (65534 upward,
     * so the counter wraps). createUniqID reads the clock itself: the month start is set that far before it, and
     * a call is kept only when the clock read the same millisecond before and after it.
     */
    static Object localTime() throws Exception {
        Object[][] cases = {
            {"UTC", 1795320580000L}, {"UTC", 1795867200000L}, {"UTC", 1798761599999L}, {"UTC", 1769904000000L},
            {"UTC", 1769990400007L}, {"Asia/Shanghai", 1796054400000L}, {"Asia/Shanghai", 1796054399999L},
            {"America/New_York", 1679270400000L}, {"America/New_York", 1698714000000L},
            {"Australia/Lord_Howe", 1680307200000L}, {"Asia/Kolkata", 1767225600000L},
            {"Asia/Amman", 1460678400000L}, {"America/Havana", 1605398400000L},
        };
        Class<?> c = MessageClientIDSetter.class;
        Method set = c.getDeclaredMethod("setStartTime", long.class);
        set.setAccessible(true);
        Field start = c.getDeclaredField("startTime");
        Field next = c.getDeclaredField("nextStartTime");
        Field counterField = c.getDeclaredField("COUNTER");
        start.setAccessible(true);
        next.setAccessible(true);
        counterField.setAccessible(true);
        AtomicInteger counter = (AtomicInteger) counterField.get(null);
        TimeZone saved = TimeZone.getDefault();
        List<Object> out = new ArrayList<>();
        int nextCounter = 65534;
        try {
            for (Object[] k : cases) {
                TimeZone.setDefault(TimeZone.getTimeZone((String) k[0]));
                long now = (Long) k[1];
                set.invoke(null, now);
                long monthStart = start.getLong(null), nextMonth = next.getLong(null);
                String id;
                while (true) {
                    long before = System.currentTimeMillis();
                    start.setLong(null, before - (now - monthStart));
                    next.setLong(null, Long.MAX_VALUE);
                    counter.set(nextCounter);
                    id = MessageClientIDSetter.createUniqID();
                    if (System.currentTimeMillis() == before) {
                        break;
                    }
                }
                out.add(StoreVectors.map("tz", k[0], "now_ms", now, "month_start_ms", monthStart,
                    "next_month_start_ms", nextMonth, "diff_ms", now - monthStart, "counter", nextCounter,
                    "uniq_tail", id.substring(id.length() - 12), "human", UtilAll.timeMillisToHumanString(now)));
                nextCounter++;
            }
        } finally {
            TimeZone.setDefault(saved);
            set.invoke(null, System.currentTimeMillis());
        }
        return out;
    }

    /** IDs from a fresh copy of MessageClientIDSetter loaded by a class loader whose hash is SALT: its own static
     * initialiser builds the prefix from this machine's address, this JVM's pid and that hash. */
    static Object uniqPrefix() throws Exception {
        List<URL> urls = new ArrayList<>();
        for (String p : System.getProperty("java.class.path").split(java.io.File.pathSeparator)) {
            urls.add(Path.of(p).toUri().toURL());
        }
        try (URLClassLoader loader = new URLClassLoader(urls.toArray(new URL[0]), ClassLoader.getPlatformClassLoader()) {
            @Override
            public int hashCode() {
                return SALT;
            }
        }) {
            Class<?> c = Class.forName("org.apache.rocketmq.common.message.MessageClientIDSetter", true, loader);
            String id = (String) c.getMethod("createUniqID").invoke(null);
            byte[] ip = (byte[]) c.getMethod("getIPFromID", String.class).invoke(null, id);
            return StoreVectors.map("id", id, "ip_hex", StoreVectors.hex(ip), "pid", ProcessHandle.current().pid(),
                                    "salt", SALT & 0xFFFFFFFFL);
        }
    }

    static Map<String, Object> build(Path root, DefaultMessageStore store) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        Files.createDirectories(root);
        hasher = new IndexFile(root.resolve("00000000000000000004").toString(), 8, 16, 0, 0);
        out.put("string_hash", stringHashes());
        hasher.destroy(0);
        out.put("integer_min_value", Integer.MIN_VALUE);
        out.put("crc32", crc32());
        out.put("records", records());
        out.put("offset_msg_ids", offsetMsgIds());
        out.put("properties_parse", propertiesParse());
        out.put("properties_serialize", propertiesSerialize());
        out.put("cq_units", cqUnits(store));
        index(root, out);
        out.put("checkpoint", checkpoint(root));
        out.put("offset_file_names", offsetFileNames());
        out.put("local_time", localTime());
        out.put("uniq_prefix", uniqPrefix());
        return out;
    }
}
