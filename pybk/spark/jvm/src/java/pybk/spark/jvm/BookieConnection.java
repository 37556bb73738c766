package pybk.spark.jvm;

import io.netty.bootstrap.Bootstrap;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.ChannelPipeline;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.netty.handler.codec.http2.DefaultHttp2PingFrame;
import io.netty.handler.codec.http2.Http2CodecUtil;
import io.netty.handler.codec.http2.Http2FrameCodec;
import io.netty.handler.codec.http2.Http2FrameCodecBuilder;
import io.netty.handler.codec.http2.Http2GoAwayFrame;
import io.netty.handler.codec.http2.Http2MultiplexHandler;
import io.netty.handler.codec.http2.Http2Settings;
import io.netty.handler.codec.http2.Http2SettingsFrame;
import io.netty.handler.codec.http2.Http2StreamChannel;
import io.netty.handler.codec.http2.Http2StreamChannelBootstrap;
import io.netty.handler.ssl.ApplicationProtocolNames;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslHandler;
import io.netty.handler.ssl.SslHandshakeCompletionEvent;
import io.netty.handler.timeout.IdleStateEvent;
import io.netty.handler.timeout.IdleStateHandler;
import io.netty.util.ReferenceCountUtil;
import io.netty.util.concurrent.Future;
import io.netty.util.concurrent.Promise;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLParameters;

/**
 * One HTTP/2 connection to a bookie (TLS with ALPN h2 when the security says so), on which Read calls
 * are streams of their own. Netty's codec does the framing and flow control; this sets the windows:
 * {@link #STREAM_WINDOW} per call (what a bookie may send ahead of a slow reader) and
 * {@link #CONNECTION_WINDOW} for all of them. Unusable for new calls once it closed or got a GOAWAY.
 */
final class BookieConnection {
  static final int STREAM_WINDOW = 4 << 20;
  static final int CONNECTION_WINDOW = 64 << 20;
  private static final int MAX_FRAME = 256 << 10;
  private static final int MAX_HEADER_LIST = 64 << 10;
  /**
   * Silence, with calls in flight, after which the bookie is sent a PING; as long again unanswered, the
   * connection is closed (system property pybk.bookie.keepaliveSeconds, 30 by default).
   */
  static final int KEEPALIVE_SECONDS = Integer.getInteger("pybk.bookie.keepaliveSeconds", 30);

  final String address;
  final String host;
  final int port;
  private final Promise<Channel> ready;
  private volatile Channel channel;
  private volatile boolean usable = true;

  private BookieConnection(String address, String host, int port, Promise<Channel> ready) {
    this.address = address;
    this.host = host;
    this.port = port;
    this.ready = ready;
  }

  /** Starts connecting to host:port; {@link #await} waits for the connection (TLS, the bookie's SETTINGS). */
  static BookieConnection open(EventLoopGroup group, String address, SslContext ssl, BookieSecurity sec,
                               int connectTimeoutMs) throws BookieReadException {
    int colon = address.lastIndexOf(':');
    int port;
    try {
      port = Integer.parseInt(address.substring(colon + 1));
    } catch (NumberFormatException | IndexOutOfBoundsException e) {
      throw new BookieReadException(address, BookieReadException.TRANSPORT, "not a host:port address");
    }
    String host = address.substring(0, Math.max(colon, 0));
    if (host.startsWith("[") && host.endsWith("]")) {
      host = host.substring(1, host.length() - 1);
    }
    BookieConnection c = new BookieConnection(address, host, port, group.next().newPromise());
    Bootstrap b = new Bootstrap().group(group).channel(NioSocketChannel.class)
        .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, connectTimeoutMs)
        .option(ChannelOption.TCP_NODELAY, true)
        .option(ChannelOption.SO_KEEPALIVE, true)
        .handler(new ChannelInitializer<SocketChannel>() {
          @Override
          protected void initChannel(SocketChannel ch) {
            c.pipeline(ch, ssl, sec, connectTimeoutMs);
          }
        });
    ChannelFuture f = b.connect(host, port);
    c.channel = f.channel();
    f.addListener(done -> {
      if (!done.isSuccess()) {
        c.usable = false;
        c.ready.tryFailure(done.cause());
      }
    });
    return c;
  }

  private void pipeline(SocketChannel ch, SslContext ssl, BookieSecurity sec, int handshakeTimeoutMs) {
    ChannelPipeline p = ch.pipeline();
    if (ssl != null) {
      String name = sec.serverName != null ? sec.serverName : host;
      SslHandler tls = ssl.newHandler(ch.alloc(), name, port);
      tls.setHandshakeTimeoutMillis(handshakeTimeoutMs);
      SSLEngine engine = tls.engine();
      SSLParameters params = engine.getSSLParameters();
      params.setEndpointIdentificationAlgorithm("HTTPS");
      if (!isIpLiteral(name)) {
        params.setServerNames(List.of(new SNIHostName(name)));
      }
      engine.setSSLParameters(params);
      p.addLast(tls);
    }
    p.addLast(new IdleStateHandler(KEEPALIVE_SECONDS, 0, 0));
    Http2FrameCodec codec = Http2FrameCodecBuilder.forClient()
        .initialSettings(Http2Settings.defaultSettings().initialWindowSize(STREAM_WINDOW).maxFrameSize(MAX_FRAME)
            .maxHeaderListSize(MAX_HEADER_LIST).pushEnabled(false))
        .build();
    p.addLast(codec);
    p.addLast(new Http2MultiplexHandler(new ChannelInboundHandlerAdapter() {
      @Override
      public void channelActive(ChannelHandlerContext ctx) {
        ctx.close();   // a stream the bookie opened: bookies push nothing
      }
    }));
    p.addLast(new Watcher(codec, ssl != null));
  }

  private static boolean isIpLiteral(String name) {
    return name.indexOf(':') >= 0 || name.matches("[0-9.]+");
  }

  /**
   * The connection's state: ready once the bookie's SETTINGS came (after a TLS handshake that chose h2),
   * so that a port that does not speak HTTP/2 fails the connection, not a call; unusable after GOAWAY
   * or close.
   */
  private final class Watcher extends ChannelInboundHandlerAdapter {
    private final Http2FrameCodec codec;
    private final boolean tls;

    Watcher(Http2FrameCodec codec, boolean tls) {
      this.codec = codec;
      this.tls = tls;
    }

    @Override
    public void channelActive(ChannelHandlerContext ctx) throws Exception {
      codec.connection().local().flowController().incrementWindowSize(codec.connection().connectionStream(),
          CONNECTION_WINDOW - Http2CodecUtil.DEFAULT_WINDOW_SIZE);
      ctx.flush();
      ctx.fireChannelActive();
    }

    @Override
    public void userEventTriggered(ChannelHandlerContext ctx, Object evt) {
      if (evt instanceof IdleStateEvent) {
        keepalive(ctx);
        return;
      }
      if (evt instanceof SslHandshakeCompletionEvent && tls) {
        SslHandshakeCompletionEvent e = (SslHandshakeCompletionEvent) evt;
        if (!e.isSuccess()) {
          usable = false;
          ready.tryFailure(e.cause());
        } else {
          String protocol = ctx.pipeline().get(SslHandler.class).applicationProtocol();
          if (!ApplicationProtocolNames.HTTP_2.equals(protocol)) {
            usable = false;
            ready.tryFailure(new IllegalStateException("the server did not choose HTTP/2 in the TLS handshake"
                + " (ALPN " + protocol + ")"));
            ctx.close();
          }
        }
      }
      ctx.fireUserEventTriggered(evt);
    }

    /** A PING sent and nothing read since. */
    private boolean pinged;

    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) {
      pinged = false;
      if (msg instanceof Http2GoAwayFrame) {
        usable = false;
      } else if (msg instanceof Http2SettingsFrame) {
        ready.trySuccess(ctx.channel());
      }
      ReferenceCountUtil.release(msg);
    }

    /** A bookie silent while calls wait on it is asked for a PING, and dropped if that goes unanswered too:
     * its calls then fail at once instead of each waiting for its own timeout on a dead connection. */
    private void keepalive(ChannelHandlerContext ctx) {
      if (codec.connection().numActiveStreams() == 0) {
        return;
      }
      if (pinged) {
        usable = false;
        ctx.close();
      } else {
        pinged = true;
        ctx.writeAndFlush(new DefaultHttp2PingFrame(System.nanoTime()));
      }
    }

    @Override
    public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
      usable = false;
      ready.tryFailure(cause);
      ctx.close();
    }

    @Override
    public void channelInactive(ChannelHandlerContext ctx) {
      usable = false;
      ready.tryFailure(new IllegalStateException("the connection closed before the bookie spoke HTTP/2"
          + (tls ? "" : " (a TLS port dialled without TLS?)")));
      ctx.fireChannelInactive();
    }
  }

  /** The connection, once connected (and TLS done), within timeoutMs; else why not. */
  Channel await(long timeoutMs) throws BookieReadException {
    try {
      if (!ready.await(timeoutMs, TimeUnit.MILLISECONDS)) {
        usable = false;
        channel.close();
        throw new BookieReadException(address, BookieReadException.TRANSPORT, "cannot connect: no connection within "
            + timeoutMs + " ms");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new BookieReadException(address, BookieReadException.TRANSPORT, "interrupted connecting", e);
    }
    if (!ready.isSuccess()) {
      Throwable cause = ready.cause();
      throw new BookieReadException(address, BookieReadException.TRANSPORT, "cannot connect: " + describe(cause),
          cause);
    }
    return ready.getNow();
  }

  static String describe(Throwable t) {
    String s = t.getClass().getSimpleName() + (t.getMessage() != null ? ": " + t.getMessage() : "");
    Throwable c = t.getCause();
    if (c != null && c != t && c.getMessage() != null && (t.getMessage() == null
        || !t.getMessage().contains(c.getMessage()))) {
      s += " (" + c.getClass().getSimpleName() + ": " + c.getMessage() + ")";
    }
    return s;
  }

  /** Whether the connection was made (and has not failed to be made). */
  boolean established() {
    return ready.isSuccess();
  }

  /** Whether new calls may go on this connection. */
  boolean usable() {
    Channel ch = channel;
    return usable && (!ready.isDone() || (ready.isSuccess() && ch.isActive()));
  }

  /** Done when the connection closed. */
  ChannelFuture closeFuture() {
    return channel.closeFuture();
  }

  void close() {
    usable = false;
    channel.close();
  }

  /** A new stream for a call, read by {@code handler}, with reading under the handler's control. */
  Future<Http2StreamChannel> openStream(ChannelInboundHandlerAdapter handler) {
    return new Http2StreamChannelBootstrap(channel).option(ChannelOption.AUTO_READ, false).handler(handler).open();
  }
}
