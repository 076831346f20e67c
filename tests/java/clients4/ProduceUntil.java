package clients4;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * Sync sends of {@code <mode>-<i>}, one after the other, until the file {@code stop} exists (a test's signal), with
 * the client's default retries (or {@code retries=n} more attempts per send; 0: each body goes out once, so the log
 * can hold no second copy of it). Prints {"acked": [bodies answered SEND_OK], "failed": n}: what a producer that keeps
 * going through a broker failure got acknowledged.
 */
public final class ProduceUntil {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Common.args(argv);
        String topic = args.get("topic");
        Path stop = Path.of(args.get("stop"));
        DefaultMQProducer producer = Common.configure(new DefaultMQProducer(args.get("group")), args);
        if (args.containsKey("retries")) {
            producer.setRetryTimesWhenSendFailed(Integer.parseInt(args.get("retries")));
        }
        producer.start();
        List<String> acked = new ArrayList<>();
        int failed = 0;
        try {
            for (int i = 0; !Files.exists(stop); i++) {
                Message m = Common.message(topic, "until", i);
                try {
                    SendResult r = producer.send(m);
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        acked.add("until-" + i);
                    } else {
                        failed++;
                    }
                } catch (Exception e) {
                    failed++;
                }
            }
        } finally {
            producer.shutdown();
        }
        Common.print(Map.of("acked", acked, "failed", failed));
    }
}
