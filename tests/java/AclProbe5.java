import java.nio.charset.StandardCharsets;
import java.time.Duration;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientConfigurationBuilder;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.StaticSessionCredentialsProvider;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * One send from rocketmq-client-java 5.x's Producer, signed by its StaticSessionCredentialsProvider when an access
 * key is given: {@code AclProbe5 ENDPOINT TOPIC [ACCESS_KEY SECRET_KEY]}. Prints {@code SENT <message id>}, or
 * {@code REFUSED} and each exception of the failure's cause chain (class and message) on its own line.
 */
public final class AclProbe5 {
    public static void main(String[] args) throws Exception {
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        ClientConfigurationBuilder builder = ClientConfiguration.newBuilder().setEndpoints(args[0])
            .setRequestTimeout(Duration.ofSeconds(5)).enableSsl(false).setMaxStartupAttempts(1);
        if (args.length > 3) {
            builder.setCredentialProvider(new StaticSessionCredentialsProvider(args[2], args[3]));
        }
        String topic = args[1];
        // no topics at start: the send itself meets the endpoint's checks (a refused route or settings sync at
        // start-up fails the client with a cancellation that does not name them)
        try (Producer producer = provider.newProducerBuilder().setClientConfiguration(builder.build()).build()) {
            Message message = provider.newMessageBuilder().setTopic(topic)
                .setBody("signed".getBytes(StandardCharsets.UTF_8)).build();
            SendReceipt receipt = producer.send(message);
            System.out.println("SENT " + receipt.getMessageId());
        } catch (Throwable t) {
            System.out.println("REFUSED");
            for (Throwable c = t; c != null; c = c.getCause()) {
                System.out.println(c.getClass().getSimpleName() + ": " + c.getMessage());
            }
        }
        System.out.flush();
        System.exit(0);  // the client's threads would keep the JVM up; a refusal is the result read
    }
}
