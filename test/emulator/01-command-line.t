# The command line other tools rely on: flags, the "listening on" line,
# exit codes, prompt shutdown on signals, and a log that never shows keys.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use File::Temp qw(tempfile);
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);
use StripeEmulatorHarness;

my $binary = StripeEmulatorHarness::binary();
ok(-x $binary, "emulator binary exists at $binary") or BAIL_OUT('build tools/stripe-emulator first');

# Runs the binary to completion; returns (exit code, stdout, stderr).
sub run_binary {
  my (@args) = @_;
  my (undef, $out_file) = tempfile(UNLINK => 1);
  my (undef, $err_file) = tempfile(UNLINK => 1);
  system("'$binary' " . join(' ', map {"'$_'"} @args) . " >$out_file 2>$err_file");
  local $/;
  open my $out, '<', $out_file or die;
  open my $err, '<', $err_file or die;
  return ($? >> 8, scalar <$out>, scalar <$err>);
}

{
  my ($code, $out, $err) = run_binary('--help');
  is($code, 0, '--help exits 0');
  like($out, qr/usage: billguard-stripe-emulator --listen HOST:PORT/, '--help prints usage on stdout');
  like($out, qr/--idempotency-ttl.*--rate-limit.*--latency-ms.*--api-key.*--search-delay-ms.*--api-version.*--quiet/s,
    '--help lists every flag');
}

for my $case (
  [['--bogus'],                                  'unknown flag'],
  [[],                                           'missing --listen'],
  [['--listen', '127.0.0.1'],                    'listen address without port'],
  [['--listen', '127.0.0.1:70000'],              'port out of range'],
  [['--listen', '127.0.0.1:0', '--latency-ms'],  'flag without value'],
  [['--listen', '127.0.0.1:0', '--rate-limit', 'ten'], 'non-numeric value'],
  [['--listen', '127.0.0.1:0', '--idempotency-ttl', '-1'], 'negative value'],
  [['--listen', '127.0.0.1:0', '--api-version', 'latest'], 'an API version that is not a date'],
) {
  my ($args, $what) = @$case;
  my ($code, $out, $err) = run_binary(@$args);
  is($code, 2, "$what: exit 2");
  like($err, qr/usage:/, "$what: usage on stderr");
  is($out, '', "$what: nothing on stdout");
}

{
  my ($code, undef, $err) = run_binary('--listen', '127.0.0.1:0', '--api-key', '');
  is($code, 2, 'an empty --api-key is refused');
}

{
  my $emulator = StripeEmulatorHarness->start(args => ['--latency-ms', '0']);
  like($emulator->{announcement}, qr/^listening on 127\.0\.0\.1:\d+$/, 'announces the actual port');
  isnt($emulator->port, 0, 'port 0 was replaced by a real port');
  my $started = time;
  my $status = $emulator->stop('TERM');
  ok(defined $status, 'SIGTERM stops the emulator');
  is($status, 0, 'SIGTERM: exit status 0');
  cmp_ok(time - $started, '<', 2, 'SIGTERM: prompt');
}

{
  # A stop must not wait for requests in progress (here: a 5 s latency sleep).
  my $emulator = StripeEmulatorHarness->start(args => ['--latency-ms', '5000']);
  my $socket = $emulator->connect_raw;
  $emulator->send_raw_request($socket, GET => '/v1/payment_intents');
  sleep 0.2;
  my $started = time;
  is($emulator->stop('INT'), 0, 'SIGINT with a request in progress: exit status 0');
  cmp_ok(time - $started, '<', 2, 'SIGINT: prompt');
}

{
  my (undef, $log_file) = tempfile(UNLINK => 1);
  my $emulator = StripeEmulatorHarness->start(quiet => 0, stderr => $log_file);
  my $secret = 'sk_test_ThisKeyMustNeverBeLogged0042';
  my $params = StripeEmulatorHarness::payment_intent_params();
  $emulator->post_form('/v1/payment_intents', $params, api_key => $secret, idempotency_key => 'log-key');
  $emulator->post_form('/v1/payment_intents', $params, api_key => $secret, idempotency_key => 'log-key');
  $emulator->stop;
  open my $log, '<', $log_file or die;
  my @lines = <$log>;
  is(scalar(grep {m{^POST /v1/payment_intents 200 replayed=false$}} @lines), 1, 'log line for the first request');
  is(scalar(grep {m{^POST /v1/payment_intents 200 replayed=true$}} @lines), 1, 'log line for the replay');
  ok(!grep({/ThisKeyMustNeverBeLogged|sk_test_/} @lines), 'the log never shows the API key');
}

done_testing;
