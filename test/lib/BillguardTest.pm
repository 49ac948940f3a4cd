# Helpers shared by billguard's TAP scenarios (test/t/*.pl): a preloaded
# node with the extension, demo accounts, and a gate that releases many
# sessions at the same instant so races really race.
package BillguardTest;

use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;
use Exporter 'import';

use lib "$ENV{BILLGUARD_ROOT}/test/emulator/lib";
use StripeEmulatorHarness;
use Time::HiRes qw(sleep time);

our @EXPORT = qw(billguard_node add_accounts start_gate release_gate race_psql finish_race
  start_emulator dispatch_node wait_until_settled dispatcher_pid wait_for_new_dispatcher
  succeeded_charges charges_by_key record_of set_api_key still_running);

# A started node with billguard preloaded and created in database postgres.
# Options, if the first of @conf is a hash: extension_version => '0.1.0'
# creates that version instead of the default; allows_streaming => 1 makes a
# primary a streaming replica can be made from; install_path => DIR runs the
# PostgreSQL installed there (another major) instead of the one on PATH.
# $before_start, if given next,
# runs with the initialised node before it starts and returns more
# postgresql.conf lines.
sub billguard_node {
	my ($name, @conf) = @_;
	my %options = ref $conf[0] eq 'HASH' ? %{ shift @conf } : ();
	my $before_start = ref $conf[0] eq 'CODE' ? shift @conf : sub { () };
	my $node = PostgreSQL::Test::Cluster->new($name,
		$options{install_path} ? (install_path => $options{install_path}) : ());
	$node->init(allows_streaming => $options{allows_streaming} // 0);
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'billguard'",
		"fsync = off",
		"max_connections = 50",
		$before_start->($node),
		@conf));
	$node->start;
	my $version = $options{extension_version} ? " VERSION '$options{extension_version}'" : '';
	$node->safe_psql('postgres', "CREATE EXTENSION billguard$version");
	return $node;
}

# A Stripe emulator for this test, stopped by pid when the test ends.
# Options are emulator flags without dashes: latency_ms => 50, idempotency_ttl => 3.
sub start_emulator {
	my (%flags) = @_;
	my @args = map { ('--' . ($_ =~ s/_/-/gr), $flags{$_}) } sort keys %flags;
	return StripeEmulatorHarness->start(args => \@args);
}

# Writes the API key file the dispatcher reads (a reload picks it up).
sub set_api_key {
	my ($node, $key) = @_;
	my $file = $node->basedir . '/stripe.key';
	open my $fh, '>', $file or die "cannot write $file: $!";
	print $fh "$key\n";
	close $fh;
	chmod 0600, $file;
	return $file;
}

# A started node whose dispatcher charges through $emulator, with the
# extension created. @conf lines override the test defaults; an options hash
# may come first, as for billguard_node.
sub dispatch_node {
	my ($name, $emulator, @conf) = @_;
	my @options = ref $conf[0] eq 'HASH' ? (shift @conf) : ();
	return billguard_node($name, @options, sub {
		my ($node) = @_;
		my $key_file = set_api_key($node, $StripeEmulatorHarness::DEFAULT_API_KEY);
		return ("billguard.database = 'postgres'",
			"billguard.api_base = '" . $emulator->url('') . "'",
			"billguard.api_key_file = '$key_file'",
			"billguard.max_requests_per_second = 2000",
			"billguard.max_inflight = 32",
			"billguard.poll_interval = '200ms'",
			"billguard.request_timeout = '5s'");
	}, @conf);
}

# Waits until no record of the period is pending, dispatching or unknown.
sub wait_until_settled {
	my ($node, $period, $timeout) = @_;
	$timeout //= 120;
	my $deadline = time + $timeout;
	while (time < $deadline) {
		my $open = $node->safe_psql('postgres', qq{
			SELECT count(*) FROM billguard.billing_records
			 WHERE billing_period = '$period' AND status IN ('pending', 'dispatching', 'unknown')});
		return 1 if $open eq '0';
		sleep 0.1;
	}
	diag("records of $period still open after ${timeout}s: " . $node->safe_psql('postgres',
		"SELECT string_agg(status || '=' || n, ', ') FROM (SELECT status, count(*) n FROM billguard.billing_records WHERE billing_period = '$period' GROUP BY 1) s"));
	return 0;
}

# The running dispatcher's pid, or '' when none runs.
sub dispatcher_pid {
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE backend_type = 'billguard dispatcher'") || '';
}

# Waits for a dispatcher other than $old_pid to run; returns its pid.
sub wait_for_new_dispatcher {
	my ($node, $old_pid, $timeout) = @_;
	my $deadline = time + ($timeout // 30);
	while (time < $deadline) {
		my $pid = eval { dispatcher_pid($node) } // 0;
		return $pid if $pid && $pid ne '0' && $pid ne ($old_pid // '');
		sleep 0.1;
	}
	return 0;
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

# status|charge_id|attempts of one record.
sub record_of {
	my ($node, $customer, $period) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT status || '|' || coalesce(charge_id, '') || '|' || attempts FROM billguard.billing_records
		 WHERE customer_id = '$customer' AND billing_period = '$period'});
}

# Inserts $count active accounts cust_000001.. with stripe customers cus_...
sub add_accounts {
	my ($node, $count, $prefix) = @_;
	$prefix //= 'cust_';
	$node->safe_psql('postgres', qq{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
		SELECT '$prefix' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'),
		       1000 + g % 500, 'usd', 'pm_card_visa'
		  FROM generate_series(1, $count) g});
}

# A session holding an exclusive advisory lock; racers wait on it and all
# start when release_gate() terminates that session.
sub start_gate {
	my ($node) = @_;
	my $gate = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'),
		  '-c', "SET application_name = 'billguard_gate'",
		  '-c', 'SELECT pg_advisory_lock(424242), pg_sleep(600)' ],
		'>', \my $out, '2>', \my $err);
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242 AND granted")
	  or die 'gate did not take its lock';
	return $gate;
}

# Starts one racing psql session: it waits at the gate, then runs each of
# @sql in a transaction of its own.
sub race_psql {
	my ($node, @sql) = @_;
	my %r = (out => '', err => '');
	$r{handle} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		  '-c', 'DO $$BEGIN PERFORM pg_advisory_lock_shared(424242); PERFORM pg_advisory_unlock_shared(424242); END$$',
		  map { ('-c', $_) } @sql ],
		'>', \$r{out}, '2>', \$r{err});
	return \%r;
}

# Waits until $waiting sessions queue at the gate, then opens it.
sub release_gate {
	my ($node, $gate, $waiting) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) = $waiting FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242 AND NOT granted")
	  or die "racers did not reach the gate";
	$node->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'billguard_gate'");
	$gate->finish;
}

# Whether the process of an IPC::Run handle still runs, reading what it
# wrote so far. pump_nb dies on a handle whose process has ended (in a
# wait_for, a false answer until the timeout), and one may end between
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
