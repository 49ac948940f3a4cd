// The proxy's HTTP server (see http_server.hpp): the only file that
// compiles Boost.Beast and Asio, which are slow to compile.
#include "http_server.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/version.hpp>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <optional>

#include "secret_flags.hpp"
#include "stripe_errors.hpp"
#include "worker_pool.hpp"

namespace billguard::proxy {

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using boost::beast::string_view;
using boost::system::error_code;
using tcp = asio::ip::tcp;

std::string_view View(string_view s) {
  return std::string_view(s.data(), s.size());
}

// Beast's push parser, filling a Request as the handlers see it: names and
// values as sent, each line checked as it arrives (header_rules.hpp), so a
// header count or a duplicate stops the read at once.
class RequestReader final : public http::basic_parser<true> {
 public:
  explicit RequestReader(const HttpLimits& limits) : limits_(limits) {
    header_limit(static_cast<std::uint32_t>(limits.header_bytes));
    body_limit(static_cast<std::uint64_t>(limits.body_bytes));
  }

  Request request;
  int version = 11;

  // What to answer the error put() returned.
  HttpRefusal RefusalFor(const error_code& ec) const {
    if (refusal_) return *refusal_;
    if (ec == http::error::header_limit) {
      return {431, "headers_too_large",
              "the request line and headers are larger than " +
                  std::to_string(limits_.header_bytes / 1024) + " KiB"};
    }
    if (ec == http::error::body_limit) return BodyTooLarge();
    return {400, "request_malformed", "malformed HTTP request (" + ec.message() + ")"};
  }

  HttpRefusal BodyTooLarge() const {
    return {
        413, "body_too_large",
        "the request body is larger than " + std::to_string(limits_.body_bytes / 1024) + " KiB"};
  }

 private:
  void Stop(error_code& ec, HttpRefusal refusal) {
    refusal_ = std::move(refusal);
    ec = http::error::bad_value;  // any error: put() stops and the refusal answers
  }

  void on_request_impl(http::verb, string_view method, string_view target, int http_version,
                       error_code& ec) override {
    request.method.assign(method.data(), method.size());
    request.target.assign(target.data(), target.size());
    request.path = request.target.substr(0, request.target.find('?'));
    version = http_version;
    if (auto refusal = CheckRequestLine(View(method), View(target))) Stop(ec, *refusal);
  }

  void on_response_impl(int, string_view, int, error_code& ec) override {
    ec = http::error::bad_version;  // never: this parses requests
  }

  void on_field_impl(http::field, string_view name, string_view value, error_code& ec) override {
    // Before Boost 1.90 trailer fields arrive here, after the header.
    if (is_header_done()) return Stop(ec, TrailerRefusal());
    if (request.headers.size() >= limits_.header_fields) {
      return Stop(ec, {431, "headers_too_large",
                       "the request has more than " + std::to_string(limits_.header_fields) +
                           " header lines"});
    }
    if (auto refusal = CheckHeaderLine(View(name), View(value), request.headers)) {
      return Stop(ec, *refusal);
    }
    request.headers.emplace_back(std::string(name.data(), name.size()),
                                 std::string(value.data(), value.size()));
  }

#if BOOST_VERSION >= 109000
  void on_trailer_field_impl(http::field, string_view, string_view, error_code& ec) override {
    Stop(ec, TrailerRefusal());
  }
#endif

  void on_header_impl(error_code& ec) override {
    if (auto refusal = CheckHeaderSection(request, version)) Stop(ec, *refusal);
  }

  void on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code&) override {
    if (length) request.body.reserve(static_cast<std::size_t>(*length));
  }

  std::size_t on_body_impl(string_view body, error_code& ec) override {
    return Append(body, ec);
  }

  void on_chunk_header_impl(std::uint64_t, string_view extensions, error_code& ec) override {
    if (!extensions.empty()) Stop(ec, ChunkExtensionRefusal());
  }

  std::size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code& ec) override {
    return Append(body, ec);
  }

  void on_finish_impl(error_code&) override {}

  // Beast counts the limit too; this keeps it whatever the framing.
  std::size_t Append(string_view body, error_code& ec) {
    if (request.body.size() + body.size() > limits_.body_bytes) {
      Stop(ec, BodyTooLarge());
      return 0;
    }
    request.body.append(body.data(), body.size());
    return body.size();
  }

  const HttpLimits& limits_;
  std::optional<HttpRefusal> refusal_;
};

// A header the answer may carry: a handler's value could come from
// Stripe's answer, and a line break in it would split the answer.
bool Writable(const std::string& text) {
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) return false;
  }
  return !text.empty();
}

// Framing is the server's: a handler never sets it.
bool OwnedByServer(const std::string& name) {
  return SameHeaderName(name, "Content-Length") || SameHeaderName(name, "Connection") ||
         SameHeaderName(name, "Transfer-Encoding") || SameHeaderName(name, "Content-Type");
}

// A HEAD's answer carries the headers of a GET's, and no body.
std::string Serialize(const Response& response, bool close, bool say_keep_alive, bool head) {
  const string_view reason = http::obsolete_reason(static_cast<http::status>(response.status));
  std::string out = "HTTP/1.1 " + std::to_string(response.status) + " " +
                    std::string(reason.data(), reason.size()) + "\r\n";
  for (const auto& [name, value] : response.headers) {
    if (Writable(name) && Writable(value) && !OwnedByServer(name)) {
      out += name + ": " + value + "\r\n";
    }
  }
  if (Writable(response.content_type)) out += "Content-Type: " + response.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(response.body.size()) + "\r\n";
  if (close) {
    out += "Connection: close\r\n";
  } else if (say_keep_alive) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head) out += response.body;
  return out;
}

Response StripeError(int status, const std::string& type, const std::string& code,
                     const std::string& message) {
  Response response;
  response.status = status;
  response.set_content(StripeErrorBody(type, code, message), "application/json");
  return response;
}

// What a refused connection may still send after its answer, read and
// dropped so that closing does not reset the connection before the client
// has read the answer.
constexpr std::size_t kLingerBytes = 256 * 1024;
constexpr std::chrono::milliseconds kLingerTime{1000};
// Room for one header section, or one chunk's size line, past the limits.
constexpr std::size_t kReadSlack = 16 * 1024;
constexpr std::size_t kReadSize = 8 * 1024;

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, RequestHandler handler, RefusalObserver refused)
      : options_(options),
        handler_(std::move(handler)),
        refused_(std::move(refused)),
        acceptor_(io_),
        retry_(io_),
        workers_(options.worker_threads) {
    error_code ec;
    const auto address = asio::ip::make_address(options.host, ec);
    tcp::endpoint endpoint;
    if (!ec) {
      endpoint = tcp::endpoint(address, static_cast<unsigned short>(options.port));
    } else {
      // A host name (localhost): its first address.
      tcp::resolver resolver(io_);
      const auto found = resolver.resolve(options.host, std::to_string(options.port), ec);
      if (!ec && !found.empty()) endpoint = found.begin()->endpoint();
    }
    if (!ec) acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw StartupError("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                         ": " + ec.message());
    }
  }

  class Connection;

  int port() const { return acceptor_.local_endpoint().port(); }

  void Run() {
    Accept();
    io_.run();
    workers_.Stop();
  }

  void Stop() { io_.stop(); }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec == asio::error::connection_aborted) return Accept();  // the client left first
      if (ec) {
        // Out of file descriptors, say: the next accept may succeed once
        // connections have closed; never a busy loop meanwhile.
        retry_.expires_after(std::chrono::milliseconds(100));
        retry_.async_wait([this](error_code e) {
          if (!e) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  void Admit(tcp::socket socket);

  std::atomic<std::size_t> connections_{0};
  const HttpServerOptions options_;
  const RequestHandler handler_;
  const RefusalObserver refused_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  WorkerPool workers_;  // destroyed first: its jobs hold connections of io_
};

// One client connection, driven on its strand. Reads only while a request
// is incomplete; while a worker decides the request, nothing more is read,
// so pipelined bytes wait in the kernel, not in this process.
class HttpServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, tcp::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(server.options_.limits.header_bytes + kReadSlack) {
    ++server_.connections_;
  }
  ~Connection() { --server_.connections_; }

  // On the connection's strand, like everything it does on the I/O side.
  void Start() {
    asio::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->AwaitRequest(); });
  }

 private:
  enum class Phase { kIdle, kHeader, kBody, kHandling, kWriting, kLingering, kClosed };

  bool Reading() const {
    return phase_ == Phase::kIdle || phase_ == Phase::kHeader || phase_ == Phase::kBody;
  }

  // Between requests: wait until the socket is readable, holding no
  // buffer, for as long as the idle timeout.
  void AwaitRequest() {
    reader_.emplace(server_.options_.limits);
    header_bytes_ = 0;
    head_ = false;
    if (buffer_.size() > 0) {
      BeginRequest();
      return Parse();
    }
    phase_ = Phase::kIdle;
    buffer_.shrink_to_fit();
    Arm(server_.options_.idle_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (self->phase_ != Phase::kIdle) return;
      if (ec) return self->Close();
      self->Read();
    });
  }

  void BeginRequest() {
    phase_ = Phase::kHeader;
    Arm(server_.options_.header_timeout);
  }

  void Read() {
    const std::size_t room = buffer_.max_size() - buffer_.size();
    if (room == 0) {
      // Only a chunk's size line can fill the buffer (the header limit is
      // below it): an extension or size no client sends.
      return Refuse({400, "request_malformed", "a chunk size line is too long"});
    }
    socket_.async_read_some(
        buffer_.prepare(std::min(room, kReadSize)),
        [self = shared_from_this()](error_code ec, std::size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(error_code ec, std::size_t n) {
    if (!Reading()) return;
    if (ec) return Close();  // the client left; a half-sent request gets no answer
    buffer_.commit(n);
    if (phase_ == Phase::kIdle) BeginRequest();
    Parse();
  }

  void Parse() {
    for (;;) {
      if (buffer_.size() == 0) return Read();
      const bool header_was_done = reader_->is_header_done();
      const auto data = buffer_.data();
      error_code ec;
      const std::size_t used = reader_->put(data, ec);
      if (!header_was_done) {
        if (auto fold = CheckLineFolds(static_cast<const char*>(data.data()), used)) {
          return Refuse(*fold);
        }
        // Beast before 1.90 bounds only the part of the header it has not
        // consumed yet: the whole is counted here.
        header_bytes_ += used;
        if (header_bytes_ > server_.options_.limits.header_bytes) {
          return Refuse(reader_->RefusalFor(http::error::header_limit));
        }
      }
      buffer_.consume(used);
      if (ec == http::error::need_more || (!ec && used == 0 && !reader_->is_done())) return Read();
      if (ec) return Refuse(reader_->RefusalFor(ec));
      if (!header_was_done && reader_->is_header_done() && !reader_->is_done()) {
        phase_ = Phase::kBody;
        Arm(server_.options_.body_timeout);
        if (reader_->version >= 11 && reader_->request.has_header("Expect") &&
            buffer_.size() == 0) {
          return SendContinue();
        }
      }
      if (reader_->is_done()) return Dispatch();
    }
  }

  // The client waits for a word before it sends the body.
  void SendContinue() {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    writing_continue_ = true;
    asio::async_write(socket_, asio::buffer(kContinue),
                      [self = shared_from_this()](error_code ec, std::size_t) {
                        self->writing_continue_ = false;
                        if (self->phase_ != Phase::kBody) return;
                        if (ec) return self->Close();
                        self->Parse();
                      });
  }

  void Dispatch() {
    phase_ = Phase::kHandling;
    Disarm();
    close_after_answer_ = !reader_->keep_alive();
    say_keep_alive_ = reader_->version < 11 && !close_after_answer_;
    head_ = reader_->request.method == "HEAD";
    auto request = std::make_shared<Request>(std::move(reader_->request));
    server_.workers_.Submit([self = shared_from_this(), request] {
      Response response;
      try {
        self->server_.handler_(*request, response);
      } catch (...) {
        response = StripeError(500, "api_error", "", "the spend-cap proxy failed");
      }
      self->SendFromWorker(response);
    });
  }

  // On the worker. While a request is decided the connection is the
  // worker's alone (no read is pending, its deadline is disarmed), so the
  // worker sends the answer itself, as far as the socket takes it without
  // waiting, and goes on with the connection: it arms the next read, whose
  // completion comes back on the strand. Only an answer the socket does
  // not take at once is left to the I/O thread. The client so waits for no
  // other thread to be scheduled, and a request costs no wake-up of the
  // I/O thread but the one its bytes cause.
  void SendFromWorker(const Response& response) {
    out_ = Serialize(response, close_after_answer_, say_keep_alive_, head_);
    std::size_t sent = 0;
    int error = 0;
    while (sent < out_.size()) {
      const ssize_t n = ::send(socket_.native_handle(), out_.data() + sent, out_.size() - sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) error = n == 0 ? EPIPE : errno;
        break;
      }
    }
    if (error != 0) return Close();
    if (sent == out_.size()) return Answered();
    asio::post(socket_.get_executor(), [self = shared_from_this(), sent] {
      if (self->phase_ == Phase::kHandling) self->WriteRest(sent);
    });
  }

  void Refuse(const HttpRefusal& refusal) {
    if (server_.refused_) server_.refused_(refusal.status);
    // A read may be pending: the answer is written alone.
    error_code ignored;
    socket_.cancel(ignored);
    close_after_answer_ = true;
    Answer(StripeError(refusal.status, "invalid_request_error", refusal.code, refusal.message));
  }

  // An answer of the HTTP layer itself, on the I/O thread.
  void Answer(const Response& response) {
    if (phase_ == Phase::kClosed) return;
    out_ = Serialize(response, close_after_answer_, say_keep_alive_, head_);
    WriteRest(0);
  }

  // Writes out_ from `sent` on, then the connection goes on.
  void WriteRest(std::size_t sent) {
    if (sent == out_.size()) return Answered();
    phase_ = Phase::kWriting;
    Arm(server_.options_.write_timeout);
    asio::async_write(socket_, asio::buffer(out_.data() + sent, out_.size() - sent),
                      [self = shared_from_this()](error_code ec, std::size_t) {
                        if (self->phase_ != Phase::kWriting) return;
                        if (ec) return self->Close();
                        self->Answered();
                      });
  }

  void Answered() {
    out_.clear();
    if (close_after_answer_) return Linger();
    AwaitRequest();
  }

  // The answer is sent; what the client still sends is read and dropped,
  // up to a bound, before the socket closes.
  void Linger() {
    phase_ = Phase::kLingering;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    Arm(kLingerTime);
    Drain();
  }

  void Drain() {
    buffer_.clear();
    socket_.async_read_some(buffer_.prepare(kReadSize),
                            [self = shared_from_this()](error_code ec, std::size_t n) {
                              if (self->phase_ != Phase::kLingering) return;
                              self->drained_ += n;
                              if (ec || self->drained_ > kLingerBytes) return self->Close();
                              self->Drain();
                            });
  }

  void Close() {
    phase_ = Phase::kClosed;
    Disarm();
    error_code ignored;
    socket_.close(ignored);
  }

  // One deadline at a time; a new one replaces the last.
  void Arm(std::chrono::milliseconds after) {
    const unsigned generation = ++deadline_generation_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), generation](error_code ec) {
      if (ec || generation != self->deadline_generation_) return;
      self->OnDeadline();
    });
  }

  void Disarm() {
    ++deadline_generation_;
    timer_.cancel();
  }

  void OnDeadline() {
    switch (phase_) {
      case Phase::kHeader:
      case Phase::kBody: {
        // No answer can follow a write still under way.
        if (writing_continue_) return Close();
        const bool header = phase_ == Phase::kHeader;
        const auto limit = header ? server_.options_.header_timeout : server_.options_.body_timeout;
        return Refuse({408, "request_timeout",
                       std::string("the request's ") + (header ? "headers" : "body") +
                           " did not arrive within " + std::to_string(limit.count() / 1000) +
                           " s"});
      }
      case Phase::kHandling:
        return;  // the worker's answer is the end of it
      default:
        return Close();
    }
  }

  Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<RequestReader> reader_;
  Phase phase_ = Phase::kIdle;
  bool close_after_answer_ = false;
  bool say_keep_alive_ = false;
  bool writing_continue_ = false;
  bool head_ = false;
  std::size_t header_bytes_ = 0;  // of the request being read
  std::string out_;
  // Atomic: a deadline's completion may read it on the I/O thread while
  // the worker that owns the connection arms the next one.
  std::atomic<unsigned> deadline_generation_{0};
  std::size_t drained_ = 0;
};

void HttpServer::Impl::Admit(tcp::socket socket) {
  error_code ignored;
  if (connections_ >= options_.max_connections) {
    // Refused at once: a connection past the bound would take memory and
    // a descriptor the others need.
    socket.close(ignored);
    return;
  }
  socket.set_option(tcp::no_delay(true), ignored);
  std::make_shared<Connection>(*this, std::move(socket))->Start();
}

HttpServer::HttpServer(const HttpServerOptions& options, RequestHandler handler,
                       RefusalObserver refused)
    : impl_(std::make_unique<Impl>(options, std::move(handler), std::move(refused))) {}

HttpServer::~HttpServer() = default;

int HttpServer::port() const {
  return impl_->port();
}

void HttpServer::Run() {
  impl_->Run();
}

void HttpServer::Stop() {
  impl_->Stop();
}

}  // namespace billguard::proxy
