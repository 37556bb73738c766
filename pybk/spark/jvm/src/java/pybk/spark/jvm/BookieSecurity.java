package pybk.spark.jvm;

import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Objects;

/**
 * Security of connections to bookies: TLS when a CA file is given (the server certificate checked
 * against it and against the dialled host or {@code serverName}), an optional client certificate
 * and key (PEM), and a bearer token read from {@code tokenFile}. All null: plaintext, anonymous.
 * Serializable, as it is shipped from the driver to the executors; equal settings share a connection.
 */
public final class BookieSecurity implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Plaintext and no token. */
  public static final BookieSecurity NONE = new BookieSecurity(null, null, null, null, null);

  public final String caFile;
  public final String certFile;
  public final String keyFile;
  public final String serverName;
  public final String tokenFile;

  public BookieSecurity(String caFile, String certFile, String keyFile, String serverName, String tokenFile) {
    if ((certFile == null) != (keyFile == null)) {
      throw new IllegalArgumentException("a client certificate needs its key and a key its certificate");
    }
    if (certFile != null && caFile == null) {
      throw new IllegalArgumentException("a client certificate is only presented over TLS: give the CA file too");
    }
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
    this.serverName = serverName;
    this.tokenFile = tokenFile;
  }

  /**
   * From this process's environment: the variable named by names.get(option) for each option
   * (tls_ca, tls_cert, tls_key, tls_server_name, token_file), as the Python client reads its
   * own (the planner sends the names, pybk.security.settings.ENV, so they live in one place).
   */
  public static BookieSecurity fromEnv(java.util.Map<String, String> names) {
    return new BookieSecurity(env(names, "tls_ca"), env(names, "tls_cert"), env(names, "tls_key"),
        env(names, "tls_server_name"), env(names, "token_file"));
  }

  private static String env(java.util.Map<String, String> names, String option) {
    String name = names.get(option);
    String v = name == null ? null : System.getenv(name);
    return v == null || v.isEmpty() ? null : v;
  }

  /** Whether connections use TLS (a CA file is given). */
  public boolean tls() {
    return caFile != null;
  }

  /** The bearer token (the token file's text, whitespace stripped), or null without a token file. */
  String token() throws IOException {
    if (tokenFile == null) {
      return null;
    }
    String token = new String(Files.readAllBytes(Path.of(tokenFile)), StandardCharsets.UTF_8).strip();
    if (token.isEmpty()) {
      throw new IOException("token file " + tokenFile + " is empty");
    }
    return token;
  }

  @Override
  public boolean equals(Object o) {
    if (!(o instanceof BookieSecurity)) {
      return false;
    }
    BookieSecurity s = (BookieSecurity) o;
    return Objects.equals(caFile, s.caFile) && Objects.equals(certFile, s.certFile)
        && Objects.equals(keyFile, s.keyFile) && Objects.equals(serverName, s.serverName)
        && Objects.equals(tokenFile, s.tokenFile);
  }

  @Override
  public int hashCode() {
    return Objects.hash(caFile, certFile, keyFile, serverName, tokenFile);
  }

  @Override
  public String toString() {
    return tls() ? "TLS (CA " + caFile + (certFile != null ? ", certificate " + certFile : "")
        + (serverName != null ? ", server name " + serverName : "") + ")" + (tokenFile != null ? " with a token" : "")
        : "plaintext" + (tokenFile != null ? " with a token" : "");
  }
}
