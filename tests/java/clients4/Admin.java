package clients4;

import com.alibaba.fastjson.JSON;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * RocketMQ's own mqadmin ({@code MQAdminStartup}, as {@code bin/mqadmin} runs it) once per command line in one JVM.
 * The only argument is a JSON array of command lines (arrays of words). Prints {"runs": [{"command": [...],
 * "output": what the command printed, "errors": what it printed on stderr}]}. ROCKETMQ_HOME ({@code rocketmq.home.dir}) must hold
 * conf/logback_tools.xml, which mqadmin loads for its logs.
 */
public final class Admin {
    public static void main(String[] argv) throws Exception {
        PrintStream out = System.out;
        PrintStream err = System.err;
        List<Map<String, Object>> runs = new ArrayList<>();
        for (Object line : JSON.parseArray(argv[0])) {
            String[] words = ((List<?>) line).stream().map(String::valueOf).toArray(String[]::new);
            ByteArrayOutputStream buf = new ByteArrayOutputStream();
            ByteArrayOutputStream errors = new ByteArrayOutputStream();
            System.setOut(new PrintStream(buf, true, "UTF-8"));
            System.setErr(new PrintStream(errors, true, "UTF-8"));
            try {
                MQAdminStartup.main0(words, null);
            } finally {
                System.out.flush();
                System.err.flush();
                System.setOut(out);
                System.setErr(err);
            }
            Map<String, Object> run = new LinkedHashMap<>();
            run.put("command", words);
            run.put("output", buf.toString(StandardCharsets.UTF_8.name()));
            run.put("errors", errors.toString(StandardCharsets.UTF_8.name()));
            runs.add(run);
        }
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("runs", runs);
        Common.print(doc);
    }
}
