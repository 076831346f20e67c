/*
 * Independent test vectors for store/format.py, computed by the JVM itself.
 *
 * Regenerate (JDK 17+, no dependencies; run in this directory: the output records this file's SHA-256):
 *     cd tests/vectors && javac -d /tmp/mqlake-vectors Vectors.java \
 *         && java -cp /tmp/mqlake-vectors Vectors > java_vectors.json
 *
 * Everything here uses only the JDK: String.hashCode, Math.abs, java.util.zip.CRC32,
 * java.nio.ByteBuffer (big-endian by default), java.net.InetAddress, java.util.Calendar.
 * CommitLog records are assembled field by field following the layout table in
 * /work/shared/reference/rocketmq-store-and-protocol.md section 1.1; TOTALSIZE is taken from the
 * buffer position after the last field, not from a length formula.
 *
 * RocketMQ's rules that are not plain JDK calls (the properties string, the UNIQ_KEY time field, file
 * names, delay levels, the index key hash, tagsCode) are written here from the behaviour the
 * reference describes, in plain JDK code, so the vectors carry the JVM's own hashing, CRC, calendar
 * and byte-order semantics.
 */
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Calendar;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TimeZone;
import java.util.zip.CRC32;

public class Vectors {
    static final int MESSAGE_MAGIC_CODE = -626843481;     // 0xDAA320A7
    static final int MESSAGE_MAGIC_CODE_V2 = -626843477;  // 0xDAA320AB
    static final int BLANK_MAGIC_CODE = -875286124;       // 0xCBD43194
    static final int BORNHOST_V6_FLAG = 0x1 << 4;
    static final int STOREHOSTADDRESS_V6_FLAG = 0x1 << 5;
    static final char NAME_VALUE_SEPARATOR = 1;
    static final char PROPERTY_SEPARATOR = 2;

    // ------------------------------------------------------------------ tiny JSON writer
    static String q(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);  // UTF-16 code units: surrogates come out as \\uD83D\\uDE00 pairs
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7E) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        return sb.append('"').toString();
    }

    static String obj(Object... kv) {
        StringBuilder sb = new StringBuilder("{");
        for (int i = 0; i < kv.length; i += 2) {
            if (i > 0) sb.append(", ");
            sb.append(q((String) kv[i])).append(": ").append(val(kv[i + 1]));
        }
        return sb.append('}').toString();
    }

    static String val(Object v) {
        if (v == null) return "null";
        if (v instanceof String) return q((String) v);
        if (v instanceof Raw) return ((Raw) v).json;
        if (v instanceof Map) {
            List<Object> kv = new ArrayList<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                kv.add(String.valueOf(e.getKey()));
                kv.add(e.getValue());
            }
            return obj(kv.toArray());
        }
        if (v instanceof List) {
            StringBuilder sb = new StringBuilder("[");
            List<?> l = (List<?>) v;
            for (int i = 0; i < l.size(); i++) {
                boolean nested = l.get(i) instanceof Raw || l.get(i) instanceof Map;
                if (i > 0) sb.append(nested ? ",\n    " : ", ");
                sb.append(val(l.get(i)));
            }
            return sb.append(']').toString();
        }
        return String.valueOf(v);  // Integer, Long, Boolean
    }

    static final class Raw {
        final String json;
        Raw(String json) { this.json = json; }
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) sb.append(String.format("%02x", x & 0xFF));
        return sb.toString();
    }

    static byte[] ip(String literal) throws Exception {
        return InetAddress.getByName(literal).getAddress();  // literal addresses: no DNS lookup
    }

    // ------------------------------------------------------------------ RocketMQ rules, written from the reference
    // Each follows the behaviour described in shared/reference/rocketmq-store-and-protocol.md, using only the
    // JDK, so the JVM (String.hashCode, Calendar, CRC32, ByteBuffer) supplies the values.

    /** Index key hash (reference 4.2): |hashCode|, and 0 where abs() stays negative (Integer.MIN_VALUE). */
    static int indexKeyHashMethod(final String key) {
        int h = Math.abs(key.hashCode());
        return h < 0 ? 0 : h;
    }

    /** tagsCode (reference 3.2): the tag's hashCode widened to long; 0 for a missing or empty tag. */
    static long tagsString2tagsCode(final String tags) {
        return (tags == null || tags.isEmpty()) ? 0L : (long) tags.hashCode();
    }

    /** Upper-case hex of bytes (reference 2.1). */
    static String bytes2string(byte[] src) {
        StringBuilder out = new StringBuilder(src.length * 2);
        for (byte b : src) {
            out.append(String.format("%02X", b & 0xFF));
        }
        return out.toString();
    }

    /** yyyyMMddHHmmssSSS in the JVM's local time zone (reference 4.4). */
    static String timeMillisToHumanString(final long t) {
        return new java.text.SimpleDateFormat("yyyyMMddHHmmssSSS").format(new java.util.Date(t));
    }

    /** 20-digit zero-padded decimal (reference 1.5). */
    static String offset2FileName(final long offset) {
        return String.format("%020d", offset);
    }

    /** Local midnight on day 1 of the month of ``millis``, and of the next month, by java.util.Calendar
     *  (reference 2.2, part 4). */
    static long[] setStartTime(long millis) {
        Calendar c = Calendar.getInstance();
        c.setTimeInMillis(millis);
        c.set(c.get(Calendar.YEAR), c.get(Calendar.MONTH), 1, 0, 0, 0);
        c.set(Calendar.MILLISECOND, 0);
        long thisMonth = c.getTimeInMillis();
        c.add(Calendar.MONTH, 1);
        return new long[] {thisMonth, c.getTimeInMillis()};
    }

    /** Parts 4 and 5 of UNIQ_KEY (reference 2.2): (int)(now - monthStart), values in (-1,000,000, 0) clamped
     *  to 0, as 8 hex characters; then the counter's low 16 bits as 4. */
    static String uniqTail(long current, long startTime, int counter) {
        int elapsed = (int) (current - startTime);
        if (elapsed > -1_000_000 && elapsed < 0) {
            elapsed = 0;
        }
        return String.format("%08X%04X", elapsed, counter & 0xFFFF);
    }

    /** The properties parser (reference 1.4): split on 0x02; a part counts only if it is at least 3 characters
     *  long and its first 0x01 is neither its first nor its last character. */
    static Map<String, String> string2messageProperties(final String properties) {
        Map<String, String> map = new HashMap<>();
        if (properties == null) {
            return map;
        }
        for (String part : properties.split(String.valueOf(PROPERTY_SEPARATOR), -1)) {
            int sep = part.indexOf(NAME_VALUE_SEPARATOR);
            if (part.length() >= 3 && sep > 0 && sep < part.length() - 1) {
                map.put(part.substring(0, sep), part.substring(sep + 1));
            }
        }
        return map;
    }

    /** The properties writer (reference 1.4): name 0x01 value 0x02 per entry, null values skipped. */
    static String messageProperties2String(Map<String, String> properties) {
        StringBuilder out = new StringBuilder();
        if (properties != null) {
            properties.forEach((name, value) -> {
                if (value != null) {
                    out.append(name).append(NAME_VALUE_SEPARATOR).append(value).append(PROPERTY_SEPARATOR);
                }
            });
        }
        return out.toString();
    }

    /** Delay levels (reference 8.1): space-separated "<n><unit>", units s/m/h/d, level numbers from 1. */
    static Map<Integer, Long> parseDelayLevel(String levelString) {
        Map<Character, Long> unitMillis = Map.of('s', 1000L, 'm', 60_000L, 'h', 3_600_000L, 'd', 86_400_000L);
        Map<Integer, Long> levels = new LinkedHashMap<>();
        String[] tokens = levelString.split(" ");
        for (int level = 1; level <= tokens.length; level++) {
            String tok = tokens[level - 1];
            long amount = Long.parseLong(tok.substring(0, tok.length() - 1));
            levels.put(level, amount * unitMillis.get(tok.charAt(tok.length() - 1)));
        }
        return levels;
    }

    // ------------------------------------------------------------------ CommitLog record, field by field
    static byte[] buildRecord(int magic, String bornIp, int bornPort, String storeIp, int storePort, String topic,
        int queueId, int flag, long queueOffset, long physicalOffset, int sysFlag, long bornTimestamp,
        long storeTimestamp, int reconsumeTimes, long preparedTxOffset, byte[] body, String properties) throws Exception {
        byte[] topicBytes = topic.getBytes(StandardCharsets.UTF_8);
        byte[] propBytes = properties.getBytes(StandardCharsets.UTF_8);
        byte[] bornAddr = ip(bornIp);
        byte[] storeAddr = ip(storeIp);
        if (bornAddr.length == 16) sysFlag |= BORNHOST_V6_FLAG;
        if (storeAddr.length == 16) sysFlag |= STOREHOSTADDRESS_V6_FLAG;
        CRC32 crc = new CRC32();
        crc.update(body, 0, body.length);
        int bodyCrc = (int) (crc.getValue() & 0x7FFFFFFF);

        ByteBuffer bb = ByteBuffer.allocate(64 * 1024);  // big-endian by default
        bb.putInt(0);                      // 1 TOTALSIZE, back-filled below
        bb.putInt(magic);                  // 2 MAGICCODE
        bb.putInt(bodyCrc);                // 3 BODYCRC
        bb.putInt(queueId);                // 4 QUEUEID
        bb.putInt(flag);                   // 5 FLAG
        bb.putLong(queueOffset);           // 6 QUEUEOFFSET
        bb.putLong(physicalOffset);        // 7 PHYSICALOFFSET
        bb.putInt(sysFlag);                // 8 SYSFLAG
        bb.putLong(bornTimestamp);         // 9 BORNTIMESTAMP
        bb.put(bornAddr);                  // 10 BORNHOST address (4 or 16)
        bb.putInt(bornPort);               //    BORNHOST port
        bb.putLong(storeTimestamp);        // 11 STORETIMESTAMP
        bb.put(storeAddr);                 // 12 STOREHOSTADDRESS address (4 or 16)
        bb.putInt(storePort);              //    STOREHOSTADDRESS port
        bb.putInt(reconsumeTimes);         // 13 RECONSUMETIMES
        bb.putLong(preparedTxOffset);      // 14 PREPARED TRANSACTION OFFSET
        bb.putInt(body.length);            // 15 BODYLENGTH
        bb.put(body);                      //    BODY
        if (magic == MESSAGE_MAGIC_CODE_V2) {
            bb.putShort((short) topicBytes.length);  // 16 TOPICLENGTH (V2: short)
        } else {
            bb.put((byte) topicBytes.length);        // 16 TOPICLENGTH (V1: byte)
        }
        bb.put(topicBytes);                //    TOPIC
        bb.putShort((short) propBytes.length);  // 17 PROPERTIESLENGTH
        bb.put(propBytes);                 //    PROPERTIES
        int total = bb.position();
        bb.putInt(0, total);
        byte[] out = new byte[total];
        bb.flip();
        bb.get(out);
        return out;
    }

    static String recordVector(String name, int magic, String bornIp, int bornPort, String storeIp, int storePort,
        String topic, int queueId, int flag, long queueOffset, long physicalOffset, int sysFlag, long bornTimestamp,
        long storeTimestamp, int reconsumeTimes, long preparedTxOffset, String body, String properties) throws Exception {
        byte[] rec = buildRecord(magic, bornIp, bornPort, storeIp, storePort, topic, queueId, flag, queueOffset,
            physicalOffset, sysFlag, bornTimestamp, storeTimestamp, reconsumeTimes, preparedTxOffset,
            body.getBytes(StandardCharsets.UTF_8), properties);
        ByteBuffer r = ByteBuffer.wrap(rec);
        return obj("name", name, "magic", magic, "born_host", List.of(bornIp, bornPort),
            "store_host", List.of(storeIp, storePort), "topic", topic, "queue_id", queueId, "flag", flag,
            "queue_offset", queueOffset, "physical_offset", physicalOffset, "sys_flag", r.getInt(36),
            "born_timestamp", bornTimestamp, "store_timestamp", storeTimestamp, "reconsume_times", reconsumeTimes,
            "prepared_transaction_offset", preparedTxOffset, "body", body, "properties", properties,
            "body_crc", r.getInt(8), "total_size", rec.length, "hex", hex(rec));
    }

    static String offsetMsgId(String storeIp, int port, long offset) throws Exception {
        byte[] addr = ip(storeIp);
        ByteBuffer bb = ByteBuffer.allocate(addr.length + 4 + 8);
        bb.put(addr);
        bb.putInt(port);
        bb.putLong(offset);
        return bytes2string(bb.array());
    }

    public static void main(String[] args) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("generator", "tests/vectors/Vectors.java");
        // The file that produced these vectors: a vectors file older than its generator is caught without a JDK.
        byte[] source = Files.readAllBytes(Path.of(args.length > 0 ? args[0] : "Vectors.java"));
        out.put("generator_sha256", hex(MessageDigest.getInstance("SHA-256").digest(source)));
        out.put("java_version", System.getProperty("java.version"));

        // ---- String.hashCode / Math.abs / index key hash / tagsCode
        StringBuilder longAscii = new StringBuilder();
        for (int i = 0; i < 300; i++) longAscii.append((char) ('a' + (i * 7) % 26));
        StringBuilder longCjk = new StringBuilder();
        for (int i = 0; i < 300; i++) longCjk.append((char) (0x4E00 + (i * 37) % 2000));
        String[] strings = {
            "", "a", "hello", "TopicTest", "TopicTest#KEY1", longAscii.toString(),
            "\u4E2D\u6587\u4E3B\u9898",            // 中文主题
            "\u6D88\u606F#\u952E",                 // 消息#键
            "\uD83D\uDE00",                        // 😀 (U+1F600, one surrogate pair)
            "a\uD83D\uDE00b",
            "\uD834\uDD1Emusic",                   // 𝄞music (U+1D11E)
            "polygenelubricants",                  // hashCode == Integer.MIN_VALUE
            "tagA", "TagB", "TopicTest#k1", "TopicTest#k2",
            "\uD800",                              // a lone high surrogate (valid Java String)
            longCjk.toString(),                    // > 256 UTF-16 units, non-ASCII
        };
        List<Object> hashes = new ArrayList<>();
        for (String s : strings) {
            int h = s.hashCode();
            hashes.add(new Raw(obj("s", s, "utf16_units", s.length(), "hash", h, "math_abs", Math.abs(h),
                "index_key_hash", indexKeyHashMethod(s), "tags_code", tagsString2tagsCode(s))));
        }
        out.put("string_hash", hashes);
        out.put("integer_min_value", Integer.MIN_VALUE);
        out.put("math_abs_of_min_value", Math.abs(Integer.MIN_VALUE));

        // ---- CRC32
        byte[] pattern = new byte[1024];
        for (int i = 0; i < pattern.length; i++) pattern[i] = (byte) ((i * 31 + 7) & 0xFF);
        byte[] all = new byte[256];
        for (int i = 0; i < 256; i++) all[i] = (byte) i;
        Object[][] crcInputs = {
            {"empty", new byte[0]},
            {"hello", "hello".getBytes(StandardCharsets.US_ASCII)},
            {"check_123456789", "123456789".getBytes(StandardCharsets.US_ASCII)},
            {"pattern_1KiB_(i*31+7)&0xFF", pattern},
            {"bytes_0_to_255", all},
            {"hello world", "hello world".getBytes(StandardCharsets.US_ASCII)},
        };
        List<Object> crcs = new ArrayList<>();
        for (Object[] c : crcInputs) {
            byte[] data = (byte[]) c[1];
            CRC32 crc = new CRC32();
            crc.update(data, 0, data.length);
            crcs.add(new Raw(obj("name", c[0], "hex", hex(data), "crc32", crc.getValue(),
                "masked", (int) (crc.getValue() & 0x7FFFFFFF))));
        }
        out.put("crc32", crcs);

        // ---- CommitLog records
        String props = "KEYS\u0001k1 k2\u0002TAGS\u0001tagA\u0002";
        StringBuilder topic200 = new StringBuilder();
        for (int i = 0; i < 200; i++) topic200.append((char) ('A' + i % 26));
        List<Object> records = new ArrayList<>();
        records.add(new Raw(recordVector("ipv4", MESSAGE_MAGIC_CODE, "10.0.0.1", 1234, "10.0.0.2", 10911,
            "TopicTest", 3, 7, 42L, 1024L, 0, 1700000000000L, 1700000000123L, 1, 0L, "hello world", props)));
        records.add(new Raw(recordVector("ipv6_store", MESSAGE_MAGIC_CODE, "10.0.0.1", 1234, "2001:db8::2", 10911,
            "TopicTest", 3, 7, 42L, 1024L, 0, 1700000000000L, 1700000000123L, 1, 0L, "hello world", props)));
        records.add(new Raw(recordVector("ipv6_both", MESSAGE_MAGIC_CODE, "fe80::1", 40000, "2001:db8::2", 10911,
            "TopicTest", 0, 0, 0L, 2048L, 0, 1700000000000L, 1700000000123L, 0, 0L, "", props)));
        records.add(new Raw(recordVector("v2_topic200", MESSAGE_MAGIC_CODE_V2, "10.0.0.1", 1234, "10.0.0.2", 10911,
            topic200.toString(), 3, 7, 42L, 1024L, 0, 1700000000000L, 1700000000123L, 1, 0L, "hello world", props)));
        records.add(new Raw(recordVector("committed_tx_utf8", MESSAGE_MAGIC_CODE, "10.0.0.1", 1234, "10.0.0.2",
            10911, "\u4E2D\u6587\u4E3B\u9898", 1, 0, 9L, 4096L, 0x8, 1700000000000L, 1700000000456L, 0, 1024L,
            "\u6D88\u606F", "TAGS\u0001\u6807\u7B7E\u0002UNIQ_KEY\u00010A0000010000000000000000000000\u0002")));
        out.put("records", records);

        // ---- blank record (end-of-file filler)
        ByteBuffer blank = ByteBuffer.allocate(8);
        blank.putInt(4096);
        blank.putInt(BLANK_MAGIC_CODE);
        out.put("blank_4096", hex(blank.array()));

        // ---- offset message ids
        List<Object> ids = new ArrayList<>();
        ids.add(new Raw(obj("host", List.of("10.0.0.2", 10911), "offset", 1024L, "id", offsetMsgId("10.0.0.2", 10911, 1024L))));
        ids.add(new Raw(obj("host", List.of("192.168.255.254", 65535), "offset", Long.MAX_VALUE,
            "id", offsetMsgId("192.168.255.254", 65535, Long.MAX_VALUE))));
        ids.add(new Raw(obj("host", List.of("2001:db8::2", 10911), "offset", 1073741824L,
            "id", offsetMsgId("2001:db8::2", 10911, 1073741824L))));
        out.put("offset_msg_ids", ids);

        // ---- properties: Java's parser and serialiser
        String[] propInputs = {
            props,
            "KEYS\u0001k1 k2\u0002TAGS\u0001tagA",               // no trailing separator
            "a\u0001b\u0002",                                     // shortest legal segment
            "ab\u0002a\u0001\u0002\u0001b\u0002TAGS\u0001x\u0002", // short, empty value, missing key
            "k\u0001v\u0001w\u0002",                              // value keeps a later 0x01
            "noseparator\u0002K\u0001V\u0002",                    // segment without 0x01
            "\u0002\u0002K\u0001V\u0002\u0002",                   // empty segments
            "K\u0001first\u0002K\u0001second\u0002",              // duplicate key: last wins
            "\u4E2D\u0001\uD83D\uDE00\u0002",                     // non-ASCII key and value
        };
        List<Object> parsed = new ArrayList<>();
        for (String s : propInputs) {
            parsed.add(new Raw(obj("input", s, "map", new java.util.TreeMap<>(string2messageProperties(s)))));
        }
        out.put("properties_parse", parsed);
        LinkedHashMap<String, String> pm = new LinkedHashMap<>();
        pm.put("KEYS", "k1 k2");
        pm.put("TAGS", "tagA");
        pm.put("NULLVAL", null);
        pm.put("UNIQ_KEY", "ABC");
        out.put("properties_serialize", new Raw(obj("entries", List.of(List.of("KEYS", "k1 k2"), List.of("TAGS", "tagA"),
            List.of("UNIQ_KEY", "ABC")), "null_key", "NULLVAL", "string", messageProperties2String(pm),
            "utf8_hex", hex(messageProperties2String(pm).getBytes(StandardCharsets.UTF_8)))));

        // ---- ConsumeQueue units (long commitLogOffset, int size, long tagsCode)
        List<Object> cq = new ArrayList<>();
        long[][] cqIn = {
            {1024L, 200, tagsString2tagsCode("tagA")},
            {1024L, 200, tagsString2tagsCode("TopicTest#KEY1")},
            {0L, Integer.MAX_VALUE, 0L},
            {Long.MAX_VALUE, 1, tagsString2tagsCode("polygenelubricants")},
        };
        for (long[] c : cqIn) {
            ByteBuffer bb = ByteBuffer.allocate(20);
            bb.putLong(c[0]);
            bb.putInt((int) c[1]);
            bb.putLong(c[2]);
            cq.add(new Raw(obj("offset", c[0], "size", (int) c[1], "tags_code", c[2], "hex", hex(bb.array()))));
        }
        out.put("cq_units", cq);

        // ---- IndexFile header / entry, checkpoint
        ByteBuffer ih = ByteBuffer.allocate(40);
        ih.putLong(1700000000000L).putLong(1700000100000L).putLong(1024L).putLong(987654321L).putInt(3).putInt(5);
        out.put("index_header", new Raw(obj("begin_timestamp", 1700000000000L, "end_timestamp", 1700000100000L,
            "begin_phy_offset", 1024L, "end_phy_offset", 987654321L, "hash_slot_count", 3, "index_count", 5,
            "hex", hex(ih.array()))));
        int keyHash = indexKeyHashMethod("TopicTest#KEY1");
        ByteBuffer ie = ByteBuffer.allocate(20);
        ie.putInt(keyHash).putLong(1024L).putInt(100).putInt(2);
        out.put("index_entry", new Raw(obj("key", "TopicTest#KEY1", "key_hash", keyHash, "phy_offset", 1024L,
            "time_diff", 100, "prev_index", 2, "hex", hex(ie.array()))));
        out.put("index_file_size_default", 40L + 5_000_000L * 4 + 5_000_000L * 4 * 20);
        ByteBuffer cp = ByteBuffer.allocate(24);
        cp.putLong(1700000000123L).putLong(1700000000100L).putLong(1699999999000L);
        out.put("checkpoint", new Raw(obj("physic", 1700000000123L, "logics", 1700000000100L, "index", 1699999999000L,
            "hex", hex(cp.array()))));

        // ---- file names
        List<Object> names = new ArrayList<>();
        for (long off : new long[] {0L, 1073741824L, 6000000L, 1234567890123L}) {
            names.add(new Raw(obj("offset", off, "name", offset2FileName(off))));
        }
        out.put("offset_file_names", names);

        // ---- local-time dependent values, per time zone (Calendar.getInstance() uses the default zone)
        Object[][] timeCases = {
            {"UTC", 1795320580000L},                 // 2026-11-22T04:09:40Z, early-ish in the month
            {"UTC", 1795867200000L},                 // 2026-11-28T12:00:00Z, > 2^31 ms after the month start
            {"UTC", 1798761599999L},                 // 2026-12-31T23:59:59.999Z, last ms of a 31-day month
            {"UTC", 1769904000000L},                 // 2026-02-01T00:00:00.000Z, exactly the month start
            {"UTC", 1769990400007L},                 // 2026-02-02T00:00:00.007Z
            {"Asia/Shanghai", 1796054400000L},       // 2026-11-30T16:00Z = Dec 1 00:00 local
            {"Asia/Shanghai", 1796054399999L},       // one ms earlier: still November local
            // Zones with daylight saving time at dates whose rules no later tz database revises (a JDK and the
            // tzdata package of another release must agree on them)
            {"America/New_York", 1679270400000L},    // 2023-03-20T00:00Z, month started in EST, now EDT
            {"America/New_York", 1698714000000L},    // 2023-10-31T01:00Z = Oct 30 21:00 EDT, late month
            {"Australia/Lord_Howe", 1680307200000L}, // 2023-04-01T00:00Z, half-hour DST zone
            {"Asia/Kolkata", 1767225600000L},        // 2026-01-01T00:00Z
            {"Asia/Amman", 1460678400000L},          // 2016-04-15T00:00Z, local midnight of Apr 1 did not exist
            {"America/Havana", 1605398400000L},      // 2020-11-15T00:00Z, local midnight of Nov 1 happened twice
        };
        TimeZone saved = TimeZone.getDefault();
        List<Object> times = new ArrayList<>();
        int counter = 65534;
        for (Object[] c : timeCases) {
            TimeZone.setDefault(TimeZone.getTimeZone((String) c[0]));
            long now = (Long) c[1];
            long[] st = setStartTime(now);
            times.add(new Raw(obj("tz", c[0], "now_ms", now, "month_start_ms", st[0], "next_month_start_ms", st[1],
                "diff_ms", now - st[0], "counter", counter, "uniq_tail", uniqTail(now, st[0], counter),
                "human", timeMillisToHumanString(now))));
            counter++;
        }
        TimeZone.setDefault(saved);
        out.put("local_time", times);

        // ---- MessageClientIDSetter fixed prefix: ip + (short) pid + classloader hash
        List<Object> prefixes = new ArrayList<>();
        for (String ipLit : new String[] {"10.0.0.1", "2001:db8::1"}) {
            byte[] a = ip(ipLit);
            ByteBuffer bb = ByteBuffer.allocate(a.length + 2 + 4);
            bb.put(a);
            bb.putShort((short) 70000);      // a pid above 65535 is truncated by the (short) cast
            bb.putInt(0x9ABCDEF0);
            prefixes.add(new Raw(obj("ip", ipLit, "ip_hex", hex(a), "pid", 70000, "salt", 0x9ABCDEF0L,
                "prefix", bytes2string(bb.array()))));
        }
        out.put("uniq_prefix", prefixes);

        // ---- delay levels
        String levels = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";
        Map<Integer, Long> table = parseDelayLevel(levels);
        out.put("delay_levels", new Raw(obj("levels", levels, "millis", new ArrayList<>(table.values()),
            "deliver_level3_at_1700000000123", table.get(3) + 1700000000123L)));

        System.out.println(val(out));
    }
}
