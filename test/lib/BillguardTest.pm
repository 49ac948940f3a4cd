# What billguard's TAP scenarios (test/t/*.pl) share beside their nodes
# (BillguardNode.pm): the one polling helper, the Stripe emulator and the
# queries of its ledger, and the bookkeeping of racing sessions.
package BillguardTest;

use strict;
use warnings;
use Test::More;
use Time::HiRes qw(sleep time);
use Exporter 'import';

use lib "$ENV{BILLGUARD_ROOT}/test/emulator/lib";
use StripeEmulatorHarness;

our @EXPORT = qw(wait_until failures start_emulator succeeded_charges charges_by_key ledger_for_key
  succeeded_for_key finish_race still_running);

# ---- waiting ------------------------------------------------------------------

# Calls $check every $options{interval} seconds (default 0.05) until it
# returns true or $timeout seconds pass; a check that dies counts as false
# (a server restarting). True once it held; else false after a diag naming
# $what and, when given, what $options{explain}->() says of the state then.
#   ok(wait_until('the record completed', 30, sub { $node->status_of($c, $p) eq 'completed' }), ...);
sub wait_until {
	my ($what, $timeout, $check, %options) = @_;
	my $deadline = time + $timeout;
	while (1) {
		my $ok = eval { $check->() };
		return 1 if $ok;
		last if time >= $deadline;
		sleep($options{interval} // 0.05);
	}
	my $explain = $options{explain} ? eval { $options{explain}->() } // "unavailable: $@" : undef;
	diag("timed out after ${timeout}s waiting for: $what" . (defined $explain ? "\n$explain" : ''));
	return 0;
}

# How many assertions failed so far (to print diagnostics once per case).
sub failures { return scalar(grep { !$_ } Test::More->builder->summary) }

# ---- the Stripe emulator ----------------------------------------------------------

# A Stripe emulator for this test, stopped by pid when the test ends.
# Options are emulator flags without dashes: latency_ms => 50, idempotency_ttl => 3.
sub start_emulator {
	my (%flags) = @_;
	my @args = map { ('--' . ($_ =~ s/_/-/gr), $flags{$_}) } sort keys %flags;
	return StripeEmulatorHarness->start(args => \@args);
}

# The emulator's successful charges (PaymentIntents succeeded, charges paid).
sub succeeded_charges {
	my ($emulator) = @_;
	return [ grep { ($_->{status} // '') eq 'succeeded' } @{ $emulator->ledger } ];
}

# billguard_key => [ids of succeeded charges carrying it].
sub charges_by_key {
	my ($emulator) = @_;
	my %by_key;
	push @{ $by_key{ $_->{metadata}{billguard_key} // '' } }, $_->{id} for @{ succeeded_charges($emulator) };
	return \%by_key;
}

# Whether the ledger object $object carries $key as Idempotency-Key or metadata.
sub carries_key {
	my ($object, $key) = @_;
	return ($object->{idempotency_key} // '') eq $key || ($object->{metadata}{billguard_key} // '') eq $key;
}

# Ledger objects (any status) carrying $key as Idempotency-Key or metadata.
sub ledger_for_key {
	my ($emulator, $key) = @_;
	return [ grep { carries_key($_, $key) } @{ $emulator->ledger } ];
}

# The succeeded ledger objects carrying $key.
sub succeeded_for_key {
	my ($emulator, $key) = @_;
	return [ grep { carries_key($_, $key) } @{ succeeded_charges($emulator) } ];
}

# ---- racing sessions (BillguardNode's start_gate, race_psql, release_gate) ----

# Whether the process of an IPC::Run handle still runs, reading what it
# wrote so far. pump_nb dies on a handle whose process has ended (in a
# wait_until, a false answer until the timeout), and one may end between
# pumpable and pump_nb: only the answer of pumpable after the pump counts.
sub still_running {
	my ($handle) = @_;
	eval { $handle->pump_nb if $handle->pumpable; 1 };
	return $handle->pumpable;
}

# Waits for every racer and records its exit status.
sub finish_race {
	my (@racers) = @_;
	for my $r (@racers) {
		$r->{handle}->finish;
		$r->{exit} = ($r->{handle}->full_results)[0];
	}
	return @racers;
}

1;
