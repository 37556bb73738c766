package pybk.spark.jvm;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.ByteBufAllocator;
import io.netty.util.internal.PlatformDependent;
import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;

/**
 * Test driver of the Read transport: {@code ReadTool host:port ledgerId first last [--ca F --cert F
 * --key F --server-name N --token-file F --timeout-ms N --sleep-ms N --close-after N --calls N
 * --leak-check --report-memory]} prints "answer FIRST COUNT BYTES" per answer and "entry ID SIZE CRC32" per entry
 * (CRC32 of its whole body), then "end"; on failure "error STATUS MESSAGE" (STATUS as
 * BookieReadException.status) and exit 1. --sleep-ms makes it a slow consumer, sleeping after each
 * answer; --close-after N closes the stream after N answers (the call cancelled mid-way) and prints
 * "closed"; --calls N makes N concurrent calls on the shared connections, prints the first's and fails
 * unless all N read the same entries; --leak-check has Netty report buffers never released (run with
 * -Dio.netty.leakDetection.level=paranoid) after the calls; --report-memory prints "memory BYTES" last
 * but one: the most direct memory Netty's buffers took when an answer was taken.
 */
public final class ReadTool {
  private static final String USAGE = "usage: ReadTool host:port ledgerId first last [--ca F --cert F --key F "
      + "--server-name N --token-file F --timeout-ms N --sleep-ms N --close-after N --calls N --leak-check "
      + "--report-memory]";

  /** The most direct memory Netty held when an answer was taken. */
  private static final AtomicLong PEAK_DIRECT = new AtomicLong();

  private ReadTool() {
  }

  public static void main(String[] args) {
    PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8),
        1 << 16));
    int code;
    try {
      code = run(args, out);
    } catch (IllegalArgumentException e) {
      out.println(USAGE + ": " + e.getMessage());
      code = 2;
    }
    out.flush();
    System.exit(code);
  }

  private static int run(String[] args, PrintWriter out) {
    if (args.length < 4) {
      throw new IllegalArgumentException("too few arguments");
    }
    String ca = null, cert = null, key = null, serverName = null, tokenFile = null;
    long timeoutMs = 30_000, sleepMs = 0, closeAfter = -1;
    int calls = 1;
    boolean leakCheck = false, reportMemory = false;
    for (int i = 4; i < args.length; i += 2) {
      if (args[i].equals("--leak-check") || args[i].equals("--report-memory")) {
        leakCheck |= args[i].equals("--leak-check");
        reportMemory |= args[i].equals("--report-memory");
        i--;
        continue;
      }
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException(args[i] + " needs a value");
      }
      String v = args[i + 1];
      switch (args[i]) {
        case "--ca": ca = v; break;
        case "--cert": cert = v; break;
        case "--key": key = v; break;
        case "--server-name": serverName = v; break;
        case "--token-file": tokenFile = v; break;
        case "--timeout-ms": timeoutMs = Long.parseLong(v); break;
        case "--sleep-ms": sleepMs = Long.parseLong(v); break;
        case "--close-after": closeAfter = Long.parseLong(v); break;
        case "--calls": calls = Integer.parseInt(v); break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    BookieSecurity sec = new BookieSecurity(ca, cert, key, serverName, tokenFile);
    Call call = new Call(args[0], sec, Long.parseLong(args[1]), Long.parseLong(args[2]), Long.parseLong(args[3]),
        timeoutMs, sleepMs, closeAfter);
    List<List<String>> results = new ArrayList<>();
    ExecutorService pool = Executors.newFixedThreadPool(calls);
    try {
      List<Future<List<String>>> running = new ArrayList<>();
      for (int k = 0; k < calls; k++) {
        running.add(pool.submit(call::lines));
      }
      for (Future<List<String>> f : running) {
        results.add(f.get());
      }
    } catch (InterruptedException | ExecutionException e) {
      out.println("error -1 " + e);
      return 1;
    } finally {
      pool.shutdownNow();
    }
    List<String> first = results.get(0);
    first.forEach(out::println);
    if (reportMemory) {
      out.println("memory " + PEAK_DIRECT.get());
    }
    if (leakCheck) {
      leakCheck();
    }
    for (int k = 1; k < calls; k++) {
      if (!entries(results.get(k)).equals(entries(first))) {
        out.println("error -1 call " + k + " of " + calls + " read otherwise than the first");
        return 1;
      }
    }
    return first.get(first.size() - 1).startsWith("error ") ? 1 : 0;
  }

  /** A call's entries and its end: how the bookie cut its answers may differ from call to call. */
  private static List<String> entries(List<String> lines) {
    List<String> kept = new ArrayList<>();
    for (String line : lines) {
      if (!line.startsWith("answer ")) {
        kept.add(line);
      }
    }
    return kept;
  }

  /** Collects what the leak detector saw: buffers collected unreleased are reported as new ones are made. */
  private static void leakCheck() {
    for (int round = 0; round < 3; round++) {
      System.gc();
      try {
        Thread.sleep(100);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
      for (int i = 0; i < 100; i++) {
        ByteBuf b = ByteBufAllocator.DEFAULT.directBuffer(64);
        b.release();
      }
    }
  }

  /** One Read call and what it prints. */
  private static final class Call {
    final String address;
    final BookieSecurity sec;
    final long ledger, first, last, timeoutMs, sleepMs, closeAfter;

    Call(String address, BookieSecurity sec, long ledger, long first, long last, long timeoutMs, long sleepMs,
         long closeAfter) {
      this.address = address;
      this.sec = sec;
      this.ledger = ledger;
      this.first = first;
      this.last = last;
      this.timeoutMs = timeoutMs;
      this.sleepMs = sleepMs;
      this.closeAfter = closeAfter;
    }

    List<String> lines() throws InterruptedException {
      List<String> out = new ArrayList<>();
      try (PackedStream stream = BookieConnections.shared().readPacked(address, sec, ledger, first, last,
          timeoutMs)) {
        CRC32 crc = new CRC32();
        long answers = 0;
        for (PackedAnswer a; (a = stream.next()) != null; ) {
          PEAK_DIRECT.accumulateAndGet(PlatformDependent.usedDirectMemory(), Math::max);
          out.add("answer " + a.firstEntry + " " + a.count() + " " + a.bodies.length);
          int pos = 0;
          for (int i = 0; i < a.count(); i++) {
            crc.reset();
            crc.update(a.bodies, pos, a.sizes[i]);
            pos += a.sizes[i];
            out.add("entry " + (a.firstEntry + i) + " " + a.sizes[i] + " " + crc.getValue());
          }
          if (sleepMs > 0) {
            Thread.sleep(sleepMs);
          }
          if (++answers == closeAfter) {
            stream.close();
            out.add("closed");
            return out;
          }
        }
        out.add("end");
      } catch (BookieReadException e) {
        out.add("error " + e.status + " " + e.getMessage().replace('\n', ' '));
      }
      return out;
    }
  }
}
