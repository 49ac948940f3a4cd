# Helpers shared by the scheduler and failover scenarios (test/t/160..168):
# the scheduler's settings and clock, the ticks it logs and journals, and
# the check that every record of a period was charged exactly once.
package SchedulerScenario;

use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use Exporter 'import';
use BillguardTest qw(charges_by_key);

our @EXPORT = qw(set_scheduler scheduler_conf wait_for_tick ticks_issued records_of charged_once_each
  billguard_processes);

# Appends billguard.<name> = '<value>' lines to postgresql.conf (a later line
# wins) and reloads the node: set_scheduler($node, auto_bill => 'monthly',
# scheduler_now => '2031-09-01 00:00:05+00'). Returns the log offset before
# the change, for wait_for_tick.
sub set_scheduler {
	my ($node, %settings) = @_;
	my $offset = -s $node->logfile // 0;
	$node->append_conf('postgresql.conf', scheduler_conf(%settings));
	$node->reload;
	return $offset;
}

# The postgresql.conf lines for %settings (a stopped node's append_conf).
sub scheduler_conf {
	my (%settings) = @_;
	return join("\n", map { "billguard.$_ = '$settings{$_}'" } sort keys %settings);
}

# Waits for the scheduler's tick logged after byte $offset of the server log
# (a period billed, found issued, or the inconsistency warning); returns the
# line, or '' after $timeout seconds.
sub wait_for_tick {
	my ($node, $offset, $timeout) = @_;
	my $deadline = time + ($timeout // 60);
	while (time < $deadline) {
		my $log = substr(slurp_file($node->logfile), $offset // 0);
		return $1
		  if $log =~ /(billguard scheduler: (?:billed |\S+ \(due [^)]*\) was issued already|billing-scheduler's state does not list).*)$/m;
		sleep 0.05;
	}
	diag('no scheduler tick logged within ' . ($timeout // 60) . ' s');
	return '';
}

# How many BillingTickIssued events billing-scheduler holds for $period.
sub ticks_issued {
	my ($node, $period) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FROM billguard.journal
		 WHERE persistence_id = 'billing-scheduler' AND event_type = 'BillingTickIssued'
		   AND event ->> 'billing_period' = '$period'});
}

# The number of billing records of $period.
sub records_of {
	my ($node, $period) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period'");
}

# The records of $period that are not completed with the one succeeded
# charge the emulator holds for their key, as "customer: why" lines ('' when
# every record is), and the number of records checked.
sub charged_once_each {
	my ($node, $emulator, $period) = @_;
	my $by_key = charges_by_key($emulator);
	my @wrong;
	my @records = map { [ split /\|/, $_, -1 ] } split /\n/, $node->safe_psql('postgres', qq{
		SELECT customer_id || '|' || idempotency_key || '|' || status || '|' || coalesce(charge_id, '')
		  FROM billguard.billing_records WHERE billing_period = '$period' ORDER BY customer_id});
	for my $record (@records) {
		my ($customer, $key, $status, $charge) = @$record;
		my @charges = @{ $by_key->{$key} // [] };
		push @wrong, "$customer: $status, " . scalar(@charges) . ' charges at the emulator'
		  unless $status eq 'completed' && @charges == 1 && $charges[0] eq $charge;
	}
	return (join("\n", @wrong), scalar @records);
}

# The backend types of billguard's processes on $node, comma-separated.
sub billguard_processes {
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
		SELECT coalesce(string_agg(backend_type, ',' ORDER BY backend_type), '')
		  FROM pg_stat_activity WHERE backend_type LIKE 'billguard%'});
}

1;
