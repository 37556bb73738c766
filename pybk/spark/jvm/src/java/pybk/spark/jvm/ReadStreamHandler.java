package pybk.spark.jvm;

import io.netty.buffer.ByteBuf;
import io.netty.buffer.CompositeByteBuf;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.handler.codec.http2.Http2DataFrame;
import io.netty.handler.codec.http2.Http2Headers;
import io.netty.handler.codec.http2.Http2HeadersFrame;
import io.netty.handler.codec.http2.Http2ResetFrame;
import io.netty.util.ReferenceCountUtil;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;

/**
 * The event loop's side of one Read call, on its HTTP/2 stream channel: checks the response headers,
 * cuts the DATA into gRPC messages (a flag byte, a 4-byte length, the message) for its PackedStream,
 * and ends the call on the trailers' grpc-status. A message over {@link #MAX_MESSAGE} bytes is refused
 * from its length prefix, before any of it is held.
 */
final class ReadStreamHandler extends ChannelInboundHandlerAdapter {
  /** The largest gRPC message taken (a bookie's answers are a few MiB). */
  static final int MAX_MESSAGE = 16 << 20;

  private final PackedStream stream;
  private final String address;
  private final byte[] prefix = new byte[5];
  private int prefixFill;
  private CompositeByteBuf message;
  private int remaining;
  private boolean headers;
  private boolean done;

  ReadStreamHandler(PackedStream stream, String address) {
    this.stream = stream;
    this.address = address;
  }

  @Override
  public void channelActive(ChannelHandlerContext ctx) {
    ctx.read();
    ctx.fireChannelActive();
  }

  @Override
  public void channelRead(ChannelHandlerContext ctx, Object msg) {
    try {
      if (done) {
        return;
      }
      if (msg instanceof Http2HeadersFrame) {
        Http2HeadersFrame frame = (Http2HeadersFrame) msg;
        if (!headers) {
          headers = true;
          if (frame.isEndStream() && frame.headers().contains("grpc-status")) {
            trailers(ctx, frame.headers());   // Trailers-Only: the call failed before any answer
          } else if (responseHeaders(ctx, frame.headers()) && frame.isEndStream()) {
            trailers(ctx, frame.headers());
          }
        } else if (frame.isEndStream()) {
          trailers(ctx, frame.headers());
        }
      } else if (msg instanceof Http2DataFrame) {
        Http2DataFrame frame = (Http2DataFrame) msg;
        if (!headers) {
          fail(ctx, BookieReadException.TRANSPORT, "DATA before the response headers");
          return;
        }
        deframe(ctx, frame.content());
        if (frame.isEndStream() && !done) {
          fail(ctx, BookieReadException.TRANSPORT, "the call ended without trailers (no grpc-status)");
        }
      }
    } finally {
      ReferenceCountUtil.release(msg);
    }
  }

  private boolean responseHeaders(ChannelHandlerContext ctx, Http2Headers h) {
    CharSequence status = h.status();
    if (status == null || !"200".contentEquals(status)) {
      fail(ctx, BookieReadException.TRANSPORT, "HTTP status " + status + " (not a gRPC server?)");
      return false;
    }
    CharSequence type = h.get("content-type");
    if (type == null || !type.toString().startsWith("application/grpc")) {
      fail(ctx, BookieReadException.TRANSPORT, "content-type " + type + ", not application/grpc");
      return false;
    }
    return true;
  }

  private void trailers(ChannelHandlerContext ctx, Http2Headers h) {
    CharSequence code = h.get("grpc-status");
    if (code == null) {
      fail(ctx, BookieReadException.TRANSPORT, "the call ended without a grpc-status");
      return;
    }
    int status;
    try {
      status = Integer.parseInt(code.toString().trim());
    } catch (NumberFormatException e) {
      fail(ctx, BookieReadException.TRANSPORT, "grpc-status '" + code + "'");
      return;
    }
    if (status != 0) {
      CharSequence m = h.get("grpc-message");
      String text = m == null ? "" : ": " + percentDecoded(m.toString());
      fail(ctx, BookieReadException.GRPC + status, Statuses.grpc(status) + " (gRPC status " + status + ")" + text);
      return;
    }
    if (prefixFill > 0 || message != null) {
      fail(ctx, BookieReadException.TRANSPORT, "the call ended inside a message");
      return;
    }
    done = true;
    stream.end();
  }

  private static String percentDecoded(String s) {
    try {
      return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    } catch (IllegalArgumentException e) {
      return s;
    }
  }

  private void deframe(ChannelHandlerContext ctx, ByteBuf data) {
    while (data.isReadable() && !done) {
      if (message == null) {
        int n = Math.min(5 - prefixFill, data.readableBytes());
        data.readBytes(prefix, prefixFill, n);
        prefixFill += n;
        if (prefixFill < 5) {
          return;
        }
        prefixFill = 0;
        long length = ((prefix[1] & 0xFFL) << 24) | ((prefix[2] & 0xFF) << 16) | ((prefix[3] & 0xFF) << 8)
            | (prefix[4] & 0xFF);
        if (prefix[0] != 0) {
          fail(ctx, BookieReadException.TRANSPORT, "a compressed message (flag " + prefix[0]
              + "): compression is not supported");
          return;
        }
        if (length > MAX_MESSAGE) {
          fail(ctx, BookieReadException.TRANSPORT, "a message of " + length + " bytes, over the limit of "
              + MAX_MESSAGE + " bytes");
          return;
        }
        message = ctx.alloc().compositeBuffer(Integer.MAX_VALUE);
        remaining = (int) length;
      }
      int n = Math.min(remaining, data.readableBytes());
      if (n > 0) {
        message.addComponent(true, data.readRetainedSlice(n));
        remaining -= n;
      }
      if (remaining == 0) {
        CompositeByteBuf whole = message;
        message = null;
        stream.offer(whole);
      }
    }
  }

  @Override
  public void channelReadComplete(ChannelHandlerContext ctx) {
    if (!done) {
      stream.readMore(ctx);
    }
    ctx.fireChannelReadComplete();
  }

  @Override
  public void userEventTriggered(ChannelHandlerContext ctx, Object evt) {
    if (evt instanceof Http2ResetFrame && !done) {
      fail(ctx, BookieReadException.TRANSPORT, "the bookie reset the call (HTTP/2 error code "
          + ((Http2ResetFrame) evt).errorCode() + ")");
    }
    ReferenceCountUtil.release(evt);
  }

  @Override
  public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
    if (!done) {
      done = true;
      release();
      stream.error(new BookieReadException(address, BookieReadException.TRANSPORT, String.valueOf(cause), cause));
    }
    ctx.close();
  }

  @Override
  public void channelInactive(ChannelHandlerContext ctx) {
    if (!done) {
      fail(ctx, BookieReadException.TRANSPORT, "the connection or stream closed before the call ended");
    }
    release();
    ctx.fireChannelInactive();
  }

  @Override
  public void handlerRemoved(ChannelHandlerContext ctx) {
    release();
  }

  private void fail(ChannelHandlerContext ctx, int status, String why) {
    done = true;
    release();
    stream.error(new BookieReadException(address, status, why));
    ctx.close();
  }

  private void release() {
    if (message != null) {
      message.release();
      message = null;
    }
  }
}
