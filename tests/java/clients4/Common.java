package clients4;

import com.alibaba.fastjson.JSON;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.BooleanSupplier;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;

/**
 * What every program here shares: its arguments ({@code key=value}), the client settings the tests choose (TLS,
 * ACL credentials, short rounds), the messages it sends, and the JSON it prints (one document on stdout).
 */
final class Common {
    private Common() {
    }

    /** {@code key=value} arguments. TLS settings are set here, before any client class reads them. */
    static Map<String, String> args(String[] argv) {
        Map<String, String> out = new HashMap<>();
        for (String a : argv) {
            int eq = a.indexOf('=');
            out.put(a.substring(0, eq), a.substring(eq + 1));
        }
        String trust = out.get("tlsTrust");
        if (trust != null) {
            // RocketMQ's TlsSystemConfig reads these once, when the remoting classes load
            System.setProperty("tls.enable", "true");
            System.setProperty("tls.test.mode.enable", "false");
            System.setProperty("tls.client.authServer", "true");
            System.setProperty("tls.client.trustCertPath", trust);
        }
        return out;
    }

    /** The ACL hook for {@code acl=accessKey:secretKey}, else null. */
    static RPCHook hook(Map<String, String> args) {
        String acl = args.get("acl");
        if (acl == null) {
            return null;
        }
        String[] kv = acl.split(":", 2);
        return new AclClientRPCHook(new SessionCredentials(kv[0], kv[1]));
    }

    /** The NameServer, a unique instance name, and rounds short enough for a test (routes, offsets, heartbeats). */
    static <T extends ClientConfig> T configure(T client, Map<String, String> args) {
        client.setNamesrvAddr(args.get("namesrv"));
        client.setInstanceName(args.getOrDefault("instance", "i" + System.nanoTime()));
        client.setPollNameServerInterval(1000);
        client.setPersistConsumerOffsetInterval(1000);
        client.setHeartbeatBrokerInterval(2000);
        if (args.containsKey("tlsTrust")) {
            client.setUseTLS(true);
        }
        return client;
    }

    /** Message {@code i} of a {@code mode}: body, keys, tags and user properties the tests check. */
    static Message message(String topic, String mode, int i) {
        Message m = new Message(topic, "Tag" + (i % 3), "k-" + mode + "-" + i,
            (mode + "-" + i).getBytes(StandardCharsets.UTF_8));
        m.putUserProperty("idx", Integer.toString(i));
        m.putUserProperty("mode", mode);
        return m;
    }

    static Map<String, Object> sent(SendResult r, Message m) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
        out.put("status", r.getSendStatus().name());
        out.put("msgId", r.getMsgId());
        out.put("offsetMsgId", r.getOffsetMsgId());
        out.put("queueId", r.getMessageQueue().getQueueId());
        out.put("brokerName", r.getMessageQueue().getBrokerName());
        out.put("queueOffset", r.getQueueOffset());
        return out;
    }

    static Map<String, Object> received(MessageExt m) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("topic", m.getTopic());
        out.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
        out.put("keys", m.getKeys());
        out.put("tags", m.getTags());
        out.put("properties", new HashMap<>(m.getProperties()));
        out.put("msgId", m.getMsgId());
        out.put("queueId", m.getQueueId());
        out.put("queueOffset", m.getQueueOffset());
        out.put("commitLogOffset", m.getCommitLogOffset());
        out.put("reconsumeTimes", m.getReconsumeTimes());
        out.put("storeSize", m.getStoreSize());
        out.put("bodyCRC", m.getBodyCRC());
        out.put("sysFlag", m.getSysFlag());
        out.put("bornHost", m.getBornHostString());
        return out;
    }

    static List<Map<String, Object>> receivedAll(List<MessageExt> msgs) {
        List<Map<String, Object>> out = new ArrayList<>();
        for (MessageExt m : msgs) {
            out.add(received(m));
        }
        return out;
    }

    /** Polls {@code done} until true; false once {@code seconds} have passed. */
    static boolean await(BooleanSupplier done, double seconds) throws InterruptedException {
        long end = System.nanoTime() + (long) (seconds * 1e9);
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > end) {
                return false;
            }
            Thread.sleep(20);
        }
        return true;
    }

    static void print(Object doc) {
        System.out.println(JSON.toJSONString(doc));
        System.out.flush();
    }

    static Map<String, Object> error(Throwable e) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("class", e.getClass().getSimpleName());
        out.put("message", String.valueOf(e.getMessage()));
        if (e instanceof org.apache.rocketmq.client.exception.MQBrokerException) {
            out.put("responseCode", ((org.apache.rocketmq.client.exception.MQBrokerException) e).getResponseCode());
        }
        if (e instanceof org.apache.rocketmq.client.exception.MQClientException) {
            out.put("responseCode", ((org.apache.rocketmq.client.exception.MQClientException) e).getResponseCode());
        }
        if (e.getCause() != null) {
            out.put("cause", error(e.getCause()));
        }
        return out;
    }
}
