# Helpers shared by the dispatcher scenarios (test/t/040..070): queries on
# one node, polling, records and journal of one customer and period, the
# emulator's ledger for one key, settings, and a session that holds a
# record's row lock so the dispatcher cannot record an outcome.
# Every helper takes the node and/or the emulator it works on as arguments.
package DispatchScenario;

use strict;
use warnings;
use PostgreSQL::Test::Utils;
use IPC::Run;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);
use Exporter 'import';
use BillguardTest qw(succeeded_charges);

our @EXPORT = qw(q1 failures wait_for poll_until key_of status_of bill event_types events_of
  ledger_for_key succeeded_for_key add_vault_ledger reload_with set_rate explain_case
  start_row_lock row_lock_taken end_row_lock answer_waits_for_row_lock);

# The result of $sql in database postgres of $node (dies on error).
sub q1 { my ($node, $sql) = @_; return $node->safe_psql('postgres', $sql) }

# How many assertions failed so far (to print diagnostics once per case).
sub failures { return scalar(grep { !$_ } Test::More->builder->summary) }

# Polls $check every 20 ms for up to $timeout s; true once it is, else a diag naming $what and false.
sub wait_for {
	my ($what, $timeout, $check) = @_;
	my $deadline = time + $timeout;
	while (time < $deadline) {
		my $ok = eval { $check->() };
		return 1 if $ok;
		sleep 0.02;
	}
	diag("timed out after ${timeout}s waiting for: $what");
	return 0;
}

# Polls $code until true or $timeout s pass; returns the elapsed time, or undef on timeout.
sub poll_until {
	my ($timeout, $code, $interval) = @_;
	my $start = time;
	while (time - $start < $timeout) {
		return time - $start if $code->();
		sleep($interval // 0.05);
	}
	return $code->() ? time - $start : undef;
}

# The idempotency key billguard derives for $customer and $period.
sub key_of {
	my ($node, $customer, $period) = @_;
	return q1($node, "SELECT billguard.idempotency_key('$customer', '$period')");
}

# The status of the billing record of $customer and $period ('' when none).
sub status_of {
	my ($node, $customer, $period) = @_;
	return q1($node, "SELECT status FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'");
}

# Bills $customer for $period; returns the status bill_customer answers.
sub bill {
	my ($node, $customer, $period) = @_;
	return q1($node, "SELECT status FROM billguard.bill_customer('$customer', '$period')");
}

# One entity's event types in seq_nr order, comma-separated, each with "(value)" of every one of @fields it has.
sub event_types {
	my ($node, $customer, $period, @fields) = @_;
	my $entry = join(' || ', 'event_type', map { "coalesce('(' || (event ->> '$_') || ')', '')" } @fields);
	return q1($node, qq{
		SELECT string_agg($entry, ',' ORDER BY seq_nr) FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period'});
}

# The events of one type of one entity, decoded, in seq_nr order.
sub events_of {
	my ($node, $customer, $period, $type) = @_;
	my $rows = q1($node, qq{
		SELECT event::text FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period' AND event_type = '$type' ORDER BY seq_nr});
	return [ map { decode_json($_) } grep { length } split /\n/, $rows ];
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

# The spend-cap ledger of $period as the proxy leaves it: a budget, a vault
# key, a settled and a reserved charge, their audit. $more, SQL run after it
# in the same session, finds the key in temporary table k.
sub add_vault_ledger {
	my ($node, $period, $more) = @_;
	q1($node, qq{
		CREATE TEMP TABLE k AS SELECT * FROM billguard.issue_vault_key('stripe', '$period', 500,
		  ARRAY['/v1/payment_intents'], now() + interval '40 days', false);
		SELECT a.decision, billguard.vault_settle(a.key_id, 'settled-key', 200, NULL, 'pi_settled',
		                                          '{"id": "pi_settled"}', 'req_settled', a.attempt)
		  FROM k, billguard.vault_authorize(sha256(convert_to(k.vault_key, 'UTF8')), 'POST',
		         '/v1/payment_intents', 'settled-key', repeat('a', 64), 1000, 'usd', 'cus_1', 'settled-key') a;
		SELECT a.decision
		  FROM k, billguard.vault_authorize(sha256(convert_to(k.vault_key, 'UTF8')), 'POST',
		         '/v1/payment_intents', 'reserved-key', repeat('b', 64), 2000, 'usd', 'cus_2', 'reserved-key') a;
		} . ($more // ''));
	return;
}

# ALTER SYSTEM SET (or, for undef, RESET) billguard.<name> for each setting, then reload.
sub reload_with {
	my ($node, %settings) = @_;
	q1($node, join('; ', map {
		defined $settings{$_} ? "ALTER SYSTEM SET billguard.$_ = '$settings{$_}'" : "ALTER SYSTEM RESET billguard.$_"
	} sort keys %settings));
	q1($node, 'SELECT pg_reload_conf()');
	sleep 0.3;    # the dispatcher picks SIGHUP up in its next loop
}

# Sets billguard.max_requests_per_second to $rate (undef: its default) and reloads.
sub set_rate {
	my ($node, $rate) = @_;
	return reload_with($node, max_requests_per_second => $rate);
}

# Everything a person needs to see when a case fails (diag only).
sub explain_case {
	my ($node, $emulator, $customer, $period, $key, %how) = @_;
	# The record, its journal, the emulator's ledger for $key and stats, the
	# last 30 server log lines matching $how{log_match} under the heading
	# $how{log_heading} and, with $how{emulator_log}, the last 15 requests
	# that emulator log shows.
	my $json = JSON::PP->new->canonical;
	diag("---- diagnostics for $customer/$period key $key");
	diag('record: ' . (eval { q1($node, qq{
		SELECT row_to_json(r) FROM billguard.billing_records r
		 WHERE customer_id = '$customer' AND billing_period = '$period'}) } // "unavailable: $@"));
	diag("journal:\n" . (eval { q1($node, qq{
		SELECT seq_nr || ' ' || event_type || ' ' || event::text FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period' ORDER BY seq_nr}) } // "unavailable: $@"));
	diag('emulator ledger for the key: ' . $json->encode(eval { ledger_for_key($emulator, $key) } // []));
	diag('emulator stats: ' . $json->encode(eval { $emulator->stats } // {}));
	my $log = eval { slurp_file($node->logfile) } // '';
	my @lines = grep { /^\d{4}-\d\d-\d\d / && $_ =~ $how{log_match} && !/statement:/ }
	  split /\n/, $log;
	splice(@lines, 0, @lines - 30) if @lines > 30;
	diag("$how{log_heading}:\n" . join("\n", @lines));
	if (defined $how{emulator_log}) {
		my @requests = split /\n/, (eval { slurp_file($how{emulator_log}) } // '');
		@requests = grep { m{ /v1/} } @requests;
		splice(@requests, 0, @requests - 15) if @requests > 15;
		diag("emulator requests (last 15):\n" . join("\n", @requests));
	}
	return;
}

# Starts a psql session that holds the record's row lock as soon as the record is 'dispatching'.
sub start_row_lock {
	my ($node, $customer, $period) = @_;
	# The session waits until the record is claimed (its claim committed) and
	# then locks the row in an open transaction. The dispatcher's record_*
	# functions skip a locked row, so the worker cannot commit any outcome
	# of its HTTP request while the lock is held.
	my %s = (in => '', out => '', err => '');
	$s{handle} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	$s{in} .= "SELECT 'PID:' || pg_backend_pid();\n";
	wait_for('the row-lock session to connect', 20, sub { $s{handle}->pump_nb; $s{out} =~ /PID:(\d+)/ })
	  or die "row-lock session did not start: $s{err}";
	($s{pid}) = $s{out} =~ /PID:(\d+)/;
	my $where = "customer_id = '$customer' AND billing_period = '$period'";
	$s{in} .= "BEGIN;\n"
	  . "DO \$\$BEGIN FOR i IN 1..4000 LOOP "
	  . "EXIT WHEN (SELECT status FROM billguard.billing_records WHERE $where) = 'dispatching'; "
	  . "PERFORM pg_sleep(0.005); END LOOP; END\$\$;\n"
	  . "SELECT 'LOCKED:' || status || ':' || attempts FROM billguard.billing_records WHERE $where FOR UPDATE;\n";
	$s{handle}->pump_nb;
	return \%s;
}

# Waits until the session holds the lock; returns "status:attempts" seen under it.
sub row_lock_taken {
	my ($s) = @_;
	wait_for('the row lock', 30, sub { $s->{handle}->pump_nb; $s->{out} =~ /LOCKED:/ })
	  or return "not taken ($s->{err})";
	my ($seen) = $s->{out} =~ /LOCKED:(\S+)/;
	return $seen;
}

# Ends a row-lock session (its transaction and the lock go with it).
sub end_row_lock {
	my ($s) = @_;
	eval { $s->{handle}->kill_kill(grace => 1) };
	eval { $s->{handle}->finish };
	return;
}

# Whether $node's dispatcher logged that the answer for $customer/$period
# waits for a row lock another session holds.
sub answer_waits_for_row_lock {
	my ($node, $customer, $period) = @_;
	return slurp_file($node->logfile) =~ /billguard dispatcher: \Q$customer\/$period\E: another session holds its row lock/;
}

1;
