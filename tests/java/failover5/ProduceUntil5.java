import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;

/**
 * Apache RocketMQ's 5.x Java client (rocketmq-client-java) sending {@code j5-<i>} one after the other until the file
 * {@code stop} exists, through whatever fails meanwhile (a broker killed, no master yet): the client's own retries and
 * route refresh are what is tested. {@code endpoint} is its access point, e.g. every broker of a set
 * ({@code host:portA;host:portB}).
 *
 * <p>Prints one JSON document: {"acked": [bodies the client saw acknowledged], "failed": n, "failures": [the first
 * failures' messages]}.
 */
public final class ProduceUntil5 {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (String kv : argv) {
            int eq = kv.indexOf('=');
            a.put(kv.substring(0, eq), kv.substring(eq + 1));
        }
        String topic = a.get("topic");
        Path stop = Path.of(a.get("stop"));
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfiguration config = ClientConfiguration.newBuilder().setEndpoints(a.get("endpoint"))
            .enableSsl(false).setRequestTimeout(Duration.ofSeconds(3)).build();
        Producer producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build();
        List<String> acked = new ArrayList<>();
        List<String> failures = new ArrayList<>();
        int failed = 0;
        try {
            for (int i = 0; !Files.exists(stop); i++) {
                String body = "j5-" + i;
                Message m = provider.newMessageBuilder().setTopic(topic)
                    .setBody(body.getBytes(StandardCharsets.UTF_8)).build();
                try {
                    producer.send(m);
                    acked.add(body);
                } catch (Exception e) {
                    failed++;
                    if (failures.size() < 5) {
                        failures.add(String.valueOf(e.getMessage()));
                    }
                    Thread.sleep(200);  // the client's pace while no master serves (not a wait for a state)
                }
            }
        } finally {
            producer.close();
        }
        StringBuilder out = new StringBuilder("{\"acked\":[");
        for (int i = 0; i < acked.size(); i++) {
            out.append(i == 0 ? "" : ",").append('"').append(acked.get(i)).append('"');
        }
        out.append("],\"failed\":").append(failed).append(",\"failures\":[");
        for (int i = 0; i < failures.size(); i++) {
            String text = failures.get(i).replace("\\", "\\\\").replace("\"", "\\\"").replaceAll("[\\x00-\\x1f]", " ");
            out.append(i == 0 ? "" : ",").append('"').append(text).append('"');
        }
        System.out.println(out.append("]}"));
        System.out.flush();
    }
}
