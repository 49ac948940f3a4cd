#!/usr/bin/perl
# Measures how many requests per second the emulator serves to N concurrent
# keep-alive clients (default: 64 clients, 50 ms latency, 5 s), each creating
# PaymentIntents with fresh idempotency keys as billguard would. Prints the
# rate; asserts nothing (a timing is not a test). Not run by prove.
#
#   perl test/emulator/measure-throughput.pl [--clients N] [--latency-ms N] [--seconds N]
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Getopt::Long;
use IO::Socket::INET;
use POSIX ();
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);
use StripeEmulatorHarness;

my ($clients, $latency_ms, $seconds) = (64, 50, 5);
GetOptions('clients=i' => \$clients, 'latency-ms=i' => \$latency_ms, 'seconds=f' => \$seconds)
  or die "usage: $0 [--clients N] [--latency-ms N] [--seconds N]\n";

my $emulator = StripeEmulatorHarness->start;
$emulator->configure(latency_ms => $latency_ms);
my $body = StripeEmulatorHarness::form_encode(StripeEmulatorHarness::payment_intent_params());

my @children;
my $start_at = time + 0.5;    # every client starts together
for my $client (1 .. $clients) {
  pipe(my $reader, my $writer) or die "pipe: $!";
  my $pid = fork() // die "fork: $!";
  if ($pid == 0) {
    close $reader;
    my $socket = $emulator->connect_raw;
    setsockopt($socket, IPPROTO_TCP, TCP_NODELAY, 1);
    select(undef, undef, undef, $start_at - time) if $start_at > time;
    my ($done, $failed, $deadline) = (0, 0, time + $seconds);
    while (time < $deadline) {
      $emulator->send_raw_request($socket, POST => '/v1/payment_intents', body => $body,
        idempotency_key => "bench-$client-$done-$failed");
      my $response = StripeEmulatorHarness::read_response($socket, 10);
      ($response->{status} // 0) == 200 ? $done++ : $failed++;
    }
    print $writer "$done $failed\n";
    close $writer;
    POSIX::_exit(0);
  }
  close $writer;
  push @children, [$pid, $reader];
}

my ($total, $total_failed) = (0, 0);
for my $child (@children) {
  my ($pid, $reader) = @$child;
  my ($done, $failed) = split ' ', (<$reader> // '0 0');
  waitpid($pid, 0);
  $total += $done;
  $total_failed += $failed;
}
my $stats = $emulator->stats;
$emulator->stop;
printf "%d clients, %d ms latency, %.1f s: %d requests (%d failed), %.0f req/s, max_concurrent %d\n",
  $clients, $latency_ms, $seconds, $total, $total_failed, $total / $seconds, $stats->{max_concurrent};
printf "ceiling for this latency: %.0f req/s\n", $clients * 1000 / $latency_ms if $latency_ms > 0;
