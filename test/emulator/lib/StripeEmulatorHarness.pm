package StripeEmulatorHarness;

# Starts billguard-stripe-emulator for a test and talks to it: the Stripe API
# through HTTP::Tiny, the control API as JSON, and raw sockets for the cases
# HTTP clients hide (dropped connections, hangs, concurrency).
#
#   my $emulator = StripeEmulatorHarness->start(args => ['--latency-ms', 50]);
#   my $response = $emulator->post_form('/v1/payment_intents', [amount => 1000, ...],
#                                       idempotency_key => 'k1');
#
# Every emulator started here is stopped by pid when the test ends, also when
# it dies half-way (END block).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use HTTP::Tiny;
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(sleep time);

our $DEFAULT_API_KEY = 'sk_test_billguardEmulatorHarness0001';

my %running;    # pid => 1, for the END block

sub repo_root { return abs_path(dirname(__FILE__) . '/../../..') }

sub binary {
  return $ENV{BILLGUARD_EMULATOR} // repo_root() . '/tools/stripe-emulator/billguard-stripe-emulator';
}

# Options: args => [extra flags], quiet => 0 to keep request logging,
# stderr => file to append the emulator's stderr to (default: the file named
# by $BILLGUARD_EMULATOR_STDERR, else /dev/null).
sub start {
  my ($class, %options) = @_;
  my $binary = binary();
  die "emulator binary $binary is missing; build it with make -C tools/stripe-emulator\n"
    unless -x $binary;
  my @command = ($binary, '--listen', '127.0.0.1:0');
  push @command, '--quiet' if $options{quiet} // 1;
  push @command, @{ $options{args} // [] };

  pipe(my $from_child, my $to_parent) or die "pipe: $!";
  my $pid = fork() // die "fork: $!";
  if ($pid == 0) {
    close $from_child;
    open STDOUT, '>&', $to_parent or POSIX::_exit(126);
    open STDERR, '>>', ($options{stderr} // $ENV{BILLGUARD_EMULATOR_STDERR} // '/dev/null')
      or POSIX::_exit(126);
    exec @command or POSIX::_exit(127);
  }
  close $to_parent;
  $running{$pid} = 1;

  my $line = read_line_with_timeout($from_child, 10);
  die "emulator did not announce its port (got: " . ($line // 'nothing') . ")\n"
    unless defined $line && $line =~ /^listening on 127\.0\.0\.1:(\d+)$/;
  my $self = bless {
    pid          => $pid,
    port         => $1,
    announcement => $line,
    stdout       => $from_child,
    api_key      => $DEFAULT_API_KEY,
    http         => HTTP::Tiny->new(timeout => 15, keep_alive => 1),
  }, $class;
  return $self;
}

sub read_line_with_timeout {
  my ($handle, $seconds) = @_;
  my $select = IO::Select->new($handle);
  my ($line, $deadline) = ('', time + $seconds);
  while (time < $deadline) {
    next unless $select->can_read($deadline - time);
    my $read = sysread($handle, my $byte, 1);
    return undef unless $read;
    return $line if $byte eq "\n";
    $line .= $byte;
  }
  return undef;
}

sub pid  { $_[0]{pid} }
sub port { $_[0]{port} }
sub url  { my ($self, $path) = @_; return "http://127.0.0.1:$self->{port}$path" }

# Sends SIGTERM (or the given signal) and returns the exit status, or undef if
# the emulator did not exit within five seconds (it is then killed).
sub stop {
  my ($self, $signal) = @_;
  my $pid = $self->{pid};
  return $self->{exit_status} unless $running{$pid};
  kill($signal // 'TERM', $pid);
  my $deadline = time + 5;
  while (time < $deadline) {
    if (waitpid($pid, POSIX::WNOHANG()) == $pid) {
      delete $running{$pid};
      return $self->{exit_status} = $?;
    }
    sleep 0.02;
  }
  kill 'KILL', $pid;
  waitpid($pid, 0);
  delete $running{$pid};
  return undef;
}

END {
  my $status = $?;
  for my $pid (keys %running) {
    kill 'KILL', $pid;
    waitpid($pid, 0);
  }
  $? = $status;
}

# ---- Stripe API -------------------------------------------------------------

# Options: idempotency_key, api_key (undef: no Authorization header), headers.
sub request {
  my ($self, $method, $path, $body, %options) = @_;
  my %headers = %{ $options{headers} // {} };
  my $api_key = exists $options{api_key} ? $options{api_key} : $self->{api_key};
  $headers{Authorization} = "Bearer $api_key" if defined $api_key;
  $headers{'Idempotency-Key'} = $options{idempotency_key} if defined $options{idempotency_key};
  my %arguments = (headers => \%headers);
  if (defined $body) {
    $headers{'Content-Type'} = 'application/x-www-form-urlencoded';
    $arguments{content} = $body;
  }
  my $response = $self->{http}->request($method, $self->url($path), \%arguments);
  $response->{json} = eval { decode_json($response->{content}) } if length($response->{content} // '');
  return $response;
}

# $params: array ref of name => value pairs, sent in order.
sub post_form {
  my ($self, $path, $params, %options) = @_;
  return $self->request('POST', $path, form_encode($params), %options);
}

sub get {
  my ($self, $path, $params, %options) = @_;
  $path .= '?' . form_encode($params) if $params && @$params;
  return $self->request('GET', $path, undef, %options);
}

sub form_encode { return HTTP::Tiny->new->www_form_urlencode($_[0]) }

# A confirmed off-session PaymentIntent, as billguard creates them.
sub payment_intent_params {
  my (%overrides) = @_;
  my %params = (
    amount         => 2000,
    currency       => 'usd',
    customer       => 'cus_harness',
    payment_method => 'pm_card_visa',
    confirm        => 'true',
    off_session    => 'true',
    %overrides,
  );
  return [map { ($_ => $params{$_}) } grep { defined $params{$_} } sort keys %params];
}

# ---- control API ------------------------------------------------------------

sub control {
  my ($self, $method, $path, $data) = @_;
  my %arguments;
  if (defined $data) {
    $arguments{headers} = {'Content-Type' => 'application/json'};
    $arguments{content} = ref $data ? encode_json($data) : $data;
  }
  my $response = $self->{http}->request($method, $self->url($path), \%arguments);
  $response->{json} = eval { decode_json($response->{content}) } if length($response->{content} // '');
  return $response;
}

sub ledger { return $_[0]->control(GET => '/_emulator/ledger')->{json} }
sub stats  { return $_[0]->control(GET => '/_emulator/stats')->{json} }
sub reset  { return $_[0]->control(POST => '/_emulator/reset', {}) }
sub add_fault { my ($self, %fault) = @_; return $self->control(POST => '/_emulator/faults', \%fault) }
sub configure { my ($self, %config) = @_; return $self->control(POST => '/_emulator/config', \%config) }

# ---- raw sockets ------------------------------------------------------------

sub connect_raw {
  my ($self, %options) = @_;
  return IO::Socket::INET->new(
    PeerAddr => '127.0.0.1',
    PeerPort => $self->{port},
    Proto    => 'tcp',
    %options,
  ) // die "connect: $!";
}

# Writes one complete request; returns nothing (read the answer with read_response).
sub send_raw_request {
  my ($self, $socket, $method, $path, %options) = @_;
  my $body = $options{body} // '';
  my %headers = (Host => "127.0.0.1:$self->{port}", %{ $options{headers} // {} });
  my $api_key = exists $options{api_key} ? $options{api_key} : $self->{api_key};
  $headers{Authorization} = "Bearer $api_key" if defined $api_key;
  $headers{'Idempotency-Key'} = $options{idempotency_key} if defined $options{idempotency_key};
  if (length $body) {
    $headers{'Content-Type'} //= 'application/x-www-form-urlencoded';
  }
  $headers{'Content-Length'} = length $body if length $body || $method eq 'POST';
  my $request = "$method $path HTTP/1.1\r\n" . join('', map {"$_: $headers{$_}\r\n"} sort keys %headers)
    . "\r\n" . $body;
  syswrite($socket, $request) == length($request) or die "short write: $!";
  return;
}

# Reads one response. Returns {status, headers (lower-case names), body}, or
# {timed_out => 1, bytes => ...} / {closed => 1, bytes => ...} when no
# complete response arrived.
sub read_response {
  my ($socket, $seconds) = @_;
  my $select = IO::Select->new($socket);
  my $deadline = time + ($seconds // 10);
  my $buffer = ${*$socket}{stripe_emulator_unread} // '';
  while (1) {
    if ((my $end = index($buffer, "\r\n\r\n")) >= 0) {
      my ($status_line, @header_lines) = split /\r\n/, substr($buffer, 0, $end);
      my %headers;
      for (@header_lines) { my ($name, $value) = /^([^:]+):\s*(.*)$/; $headers{lc $name} = $value }
      my $length = $headers{'content-length'} // 0;
      if (length($buffer) >= $end + 4 + $length) {
        my ($status) = $status_line =~ m{^HTTP/1\.[01] (\d{3})};
        my $body = substr($buffer, $end + 4, $length);
        ${*$socket}{stripe_emulator_unread} = substr($buffer, $end + 4 + $length);
        my $response = {status => $status, headers => \%headers, body => $body};
        $response->{json} = eval { decode_json($body) } if length $body;
        return $response;
      }
    }
    my $left = $deadline - time;
    return {timed_out => 1, bytes => $buffer} if $left <= 0 || !$select->can_read($left);
    my $read = sysread($socket, my $chunk, 65536);
    return {closed => 1, bytes => $buffer, error => ($read // $!)} unless $read;
    $buffer .= $chunk;
  }
}

# ---- webhook endpoint -------------------------------------------------------

# A listening socket standing in for a webhook endpoint: ($listener, $url).
sub webhook_listener {
  my ($path) = @_;
  my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 16, ReuseAddr => 1)
    or die "listen: $!";
  return ($listener, 'http://127.0.0.1:' . $listener->sockport . ($path // '/hooks/stripe'));
}

# Accepts the next delivery on $listener and answers it with $status (200);
# returns {path, headers, body, event}, or undef when none came in 20 s.
sub next_webhook_delivery {
  my ($listener, $status) = @_;
  IO::Select->new($listener)->can_read(20) or return undef;
  my $client = $listener->accept or return undef;
  my $buffer = '';
  my ($head, $length);
  while (1) {
    IO::Select->new($client)->can_read(10) or return undef;
    sysread($client, $buffer, 65536, length $buffer) or last;
    if (!defined $head && (my $end = index($buffer, "\r\n\r\n")) >= 0) {
      $head = substr($buffer, 0, $end);
      $buffer = substr($buffer, $end + 4);
      ($length) = $head =~ /^Content-Length: (\d+)/mi;
    }
    last if defined $head && length($buffer) >= $length;
  }
  my ($request_line, @lines) = split /\r\n/, $head;
  my %headers = map { my ($n, $v) = /^([^:]+):\s*(.*)$/; (lc $n => $v) } @lines;
  my $answer = $status // 200;
  syswrite($client, "HTTP/1.1 $answer X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
  close $client;
  my ($path) = $request_line =~ m{^POST (\S+) HTTP/1\.1$};
  return { path => $path, headers => \%headers, body => $buffer, event => decode_json($buffer) };
}

1;
