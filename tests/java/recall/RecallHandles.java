import org.apache.rocketmq.common.producer.RecallMessageHandle;

/**
 * RocketMQ's own recall handle codec, for tests/test_recall_handle.py: {@code build topic broker time id} prints
 * the handle HandleV1 builds; {@code decode handle...} prints, per handle, its four fields tab-separated or
 * {@code invalid}.
 */
public class RecallHandles {
    public static void main(String[] args) {
        if (args[0].equals("build")) {
            System.out.println(RecallMessageHandle.HandleV1.buildHandle(args[1], args[2], args[3], args[4]));
            return;
        }
        for (int i = 1; i < args.length; i++) {
            try {
                RecallMessageHandle.HandleV1 h = (RecallMessageHandle.HandleV1) RecallMessageHandle.decodeHandle(args[i]);
                System.out.println(h.getTopic() + "\t" + h.getBrokerName() + "\t" + h.getTimestampStr() + "\t" + h.getMessageId());
            } catch (Exception e) {
                System.out.println("invalid");
            }
        }
    }
}
