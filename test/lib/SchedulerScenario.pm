# Helpers of the scenarios that let billguard's scheduler bill (the
# scheduler 160-171 with the failover ones among them, 191, 192): its
# settings and clock, the ticks it logs, a session holding its next event,
# and the check that every record of a period was charged exactly once.
package SchedulerScenario;

use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Exporter 'import';
use BillguardTest qw(charges_by_key wait_until);

our @EXPORT = qw(set_scheduler scheduler_conf wait_for_tick charged_once_each billed_once
  hold_scheduler_event release_scheduler_event waits_for_scheduler_event);

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
# (a period billed, found issued, passed, or the inconsistency warning);
# returns the line, or '' after $timeout seconds.
sub wait_for_tick {
	my ($node, $offset, $timeout) = @_;
	my $line = '';
	wait_until('a scheduler tick logged', $timeout // 60, sub {
		my $log = substr(slurp_file($node->logfile), $offset // 0);
		($line) = $log =~ /(billguard scheduler: (?:billed |\S+ \(due [^)]*\) (?:was issued already|is not billed)|billing-scheduler's state does not list).*)$/m;
		return defined $line;
	});
	return $line // '';
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

# A session holding billing-scheduler's next event, inserted and not
# committed: a tick or a bill_period that has claimed its records (and
# holds the period's and billing-scheduler's locks) then waits for it when it
# appends BillingTickIssued, claims made and not committed. (A session
# holding billing-scheduler's lock itself makes the tick try again later.)
sub hold_scheduler_event {
	my ($node) = @_;
	my %holder;
	$holder{handle} = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'),
		  '-c', "SET application_name = 'scheduler_event_holder'",
		  '-c', q{BEGIN; INSERT INTO billguard.journal (persistence_id, seq_nr, event_type, event)
		          VALUES ('billing-scheduler', billguard.highest_seq_nr('billing-scheduler') + 1,
		                  'BillingTickIssued', '{}'); SELECT pg_sleep(600)} ],
		'>', \$holder{out}, '2>', \$holder{err});
	$node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE application_name = 'scheduler_event_holder' AND backend_xid IS NOT NULL})
	  or die 'the holder did not insert billing-scheduler\'s next event';
	return \%holder;
}

# Ends the holder's session, which rolls its event back; $node undef when a
# crash restart ended it already.
sub release_scheduler_event {
	my ($node, $holder) = @_;
	$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'scheduler_event_holder'}) if $node;
	$holder->{handle}->finish;
	return;
}

# Whether process $pid waits for the holder's transaction (its event).
sub waits_for_scheduler_event {
	my ($node, $pid) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_locks w JOIN pg_locks h ON h.transactionid = w.transactionid AND h.granted
		  JOIN pg_stat_activity a ON a.pid = h.pid AND a.application_name = 'scheduler_event_holder'
		 WHERE w.pid = $pid AND w.locktype = 'transactionid' AND NOT w.granted});
}

# Asserts that $period was billed once: one BillingTickIssued, one record
# per account ($accounts), every record settled and completed with the one
# succeeded charge the emulator holds for its key.
sub billed_once {
	my ($node, $emulator, $label, $period, $accounts) = @_;
	is($node->ticks_issued($period), '1', "$label: one BillingTickIssued for $period");
	is($node->records_of($period), $accounts, "$label: one record per account for $period");
	ok($node->wait_until_settled($period), "$label: every record of $period settles");
	my ($wrong, $checked) = charged_once_each($node, $emulator, $period);
	is($wrong, '', "$label: every record of $period is completed with the one charge the emulator holds for its key");
	is($checked, $accounts, "$label: $accounts records checked");
	return;
}

1;
