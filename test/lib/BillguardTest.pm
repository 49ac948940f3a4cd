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

our @EXPORT = qw(billguard_node add_accounts start_gate release_gate race_psql finish_race);

# A started node with billguard preloaded and created in database postgres.
sub billguard_node {
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'billguard'",
		"fsync = off",
		"max_connections = 50",
		@conf));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION billguard');
	return $node;
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

# Starts one racing psql session: it waits at the gate, then runs $sql.
sub race_psql {
	my ($node, $sql) = @_;
	my %r = (out => '', err => '');
	$r{handle} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		  '-c', 'DO $$BEGIN PERFORM pg_advisory_lock_shared(424242); PERFORM pg_advisory_unlock_shared(424242); END$$',
		  '-c', $sql ],
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
