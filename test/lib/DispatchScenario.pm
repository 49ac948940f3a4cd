# Dispatcher scenarios' tools for one record under test: what a person
# needs to see when a case fails (explain_case), and a session that holds
# the record's row lock so the dispatcher cannot record an outcome
# (start_row_lock). Used by the crash, idempotency-window and row-lock
# scenarios (040, 050, 120, 122); the queries every scenario asks of a node are
# BillguardNode's, the polling helper and the emulator's ledger BillguardTest's.
package DispatchScenario;

use strict;
use warnings;
use PostgreSQL::Test::Utils;
use IPC::Run;
use JSON::PP;
use Test::More;
use Exporter 'import';
use BillguardTest qw(wait_until ledger_for_key);

our @EXPORT = qw(explain_case start_row_lock row_lock_taken end_row_lock);

# Everything a person needs to see when a case fails (diag only).
sub explain_case {
	my ($node, $emulator, $customer, $period, $key, %how) = @_;
	# The record, its journal, the emulator's ledger for $key and stats, the
	# last 30 server log lines matching $how{log_match} under the heading
	# $how{log_heading} and, with $how{emulator_log}, the last 15 requests
	# that emulator log shows.
	my $json = JSON::PP->new->canonical;
	diag("---- diagnostics for $customer/$period key $key");
	diag('record: ' . (eval { $node->q1(qq{
		SELECT row_to_json(r) FROM billguard.billing_records r
		 WHERE customer_id = '$customer' AND billing_period = '$period'}) } // "unavailable: $@"));
	diag("journal:\n" . (eval { $node->q1(qq{
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
	wait_until('the row-lock session to connect', 20, sub { $s{handle}->pump_nb; $s{out} =~ /PID:(\d+)/ })
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
	wait_until('the row lock', 30, sub { $s->{handle}->pump_nb; $s->{out} =~ /LOCKED:/ })
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

1;
