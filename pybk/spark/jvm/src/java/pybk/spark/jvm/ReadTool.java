package pybk.spark.jvm;

import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32;

/**
 * Test driver of the Read transport: {@code ReadTool host:port ledgerId first last [--ca F --cert F
 * --key F --server-name N --token-file F --timeout-ms N --sleep-ms N --close-after N]} prints "answer FIRST COUNT BYTES"
 * per answer and "entry ID SIZE CRC32" per entry (CRC32 of its whole body), then "end"; on failure
 * "error STATUS MESSAGE" (STATUS as BookieReadException.status) and exit 1. --sleep-ms makes it a slow
 * consumer, sleeping after each answer; --close-after N closes the stream after N answers (the call
 * cancelled mid-way) and prints "closed".
 */
public final class ReadTool {
  private ReadTool() {
  }

  public static void main(String[] args) {
    PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8),
        1 << 16));
    int code = run(args, out);
    out.flush();
    System.exit(code);
  }

  private static int run(String[] args, PrintWriter out) {
    if (args.length < 4) {
      out.println("usage: ReadTool host:port ledgerId first last [--ca F --cert F --key F --server-name N "
          + "--token-file F --timeout-ms N --sleep-ms N --close-after N]");
      return 2;
    }
    String ca = null, cert = null, key = null, serverName = null, tokenFile = null;
    long timeoutMs = 30_000, sleepMs = 0, closeAfter = -1;
    for (int i = 4; i < args.length; i += 2) {
      String v = i + 1 < args.length ? args[i + 1] : null;
      if (v == null) {
        out.println("usage: " + args[i] + " needs a value");
        return 2;
      }
      switch (args[i]) {
        case "--ca": ca = v; break;
        case "--cert": cert = v; break;
        case "--key": key = v; break;
        case "--server-name": serverName = v; break;
        case "--token-file": tokenFile = v; break;
        case "--timeout-ms": timeoutMs = Long.parseLong(v); break;
        case "--sleep-ms": sleepMs = Long.parseLong(v); break;
        case "--close-after": closeAfter = Long.parseLong(v); break;
        default:
          out.println("usage: unknown option " + args[i]);
          return 2;
      }
    }
    BookieSecurity sec = new BookieSecurity(ca, cert, key, serverName, tokenFile);
    try (PackedStream stream = BookieConnections.shared().readPacked(args[0], sec, Long.parseLong(args[1]),
        Long.parseLong(args[2]), Long.parseLong(args[3]), timeoutMs)) {
      CRC32 crc = new CRC32();
      long answers = 0;
      for (PackedAnswer a; (a = stream.next()) != null; ) {
        out.println("answer " + a.firstEntry + " " + a.count() + " " + a.bodies.length);
        int pos = 0;
        for (int i = 0; i < a.count(); i++) {
          crc.reset();
          crc.update(a.bodies, pos, a.sizes[i]);
          pos += a.sizes[i];
          out.println("entry " + (a.firstEntry + i) + " " + a.sizes[i] + " " + crc.getValue());
        }
        if (sleepMs > 0) {
          out.flush();
          Thread.sleep(sleepMs);
        }
        if (++answers == closeAfter) {
          stream.close();
          out.println("closed");
          return 0;
        }
      }
      out.println("end");
      return 0;
    } catch (BookieReadException e) {
      out.println("error " + e.status + " " + e.getMessage().replace('\n', ' '));
      return 1;
    } catch (InterruptedException e) {
      out.println("error -1 interrupted");
      return 1;
    }
  }
}
