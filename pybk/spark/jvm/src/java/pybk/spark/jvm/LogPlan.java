package pybk.spark.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * The plan of a log scan as the driver's Python writes it (pybk/spark/jvm/plan.py):
 * {"partitions": [{"log", "ledger", "first", "last", "segFirst", "lo", "hi", "digest",
 * "password" (base64), "fragments": [[first entry, ["host:port", ...]], ...]}], "security":
 * {"tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file"} or null (the executors' own,
 * from the variables "securityEnv" names per option), "failOnDataLoss", "timeoutMs"}.
 */
final class LogPlan {
  private LogPlan() {}

  /** The planner's answer; its {"error": ...} as an exception naming the cause. */
  static JsonNode parse(String json) {
    JsonNode plan;
    try {
      plan = Json.MAPPER.readTree(json);
    } catch (Exception e) {
      throw new IllegalStateException("pybk: the planner's answer is not JSON: " + e.getMessage(), e);
    }
    if (plan.has("error")) {
      throw new PybkScanException(plan.get("error").asText());
    }
    return plan;
  }

  static InputPartition[] partitions(JsonNode plan) {
    BookieSecurity security = security(plan.get("security"));
    java.util.HashMap<String, String> env = new java.util.HashMap<>();
    plan.path("securityEnv").fields().forEachRemaining(e -> env.put(e.getKey(), e.getValue().asText()));
    boolean failOnDataLoss = plan.path("failOnDataLoss").asBoolean(true);
    long timeoutMs = plan.path("timeoutMs").asLong(30_000);
    List<InputPartition> out = new ArrayList<>();
    for (JsonNode p : plan.path("partitions")) {
      JsonNode frags = p.get("fragments");
      long[] firsts = new long[frags.size()];
      String[][] bookies = new String[frags.size()][];
      for (int i = 0; i < frags.size(); i++) {
        firsts[i] = frags.get(i).get(0).asLong();
        JsonNode ens = frags.get(i).get(1);
        bookies[i] = new String[ens.size()];
        for (int j = 0; j < ens.size(); j++) {
          bookies[i][j] = ens.get(j).asText();
        }
      }
      out.add(new LogInputPartition(
          p.get("log").asText(), p.get("ledger").asLong(), p.get("first").asLong(), p.get("last").asLong(),
          p.get("segFirst").asLong(), p.get("lo").asLong(), p.get("hi").asLong(),
          Digest.valueOf(p.get("digest").asText()), Base64.getDecoder().decode(p.path("password").asText("")),
          firsts, bookies, security, env, failOnDataLoss, timeoutMs));
    }
    return out.toArray(new InputPartition[0]);
  }

  private static BookieSecurity security(JsonNode s) {
    if (s == null || s.isNull()) {
      return null;
    }
    return new BookieSecurity(text(s, "tls_ca"), text(s, "tls_cert"), text(s, "tls_key"),
        text(s, "tls_server_name"), text(s, "token_file"));
  }

  private static String text(JsonNode n, String field) {
    JsonNode v = n.get(field);
    return v == null || v.isNull() ? null : v.asText();
  }
}
