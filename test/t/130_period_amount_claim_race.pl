# A period amount changed by a racing session at the moment its record is
# claimed: the claim and the change never both win. Each order of the two,
# held open on purpose, with the dispatcher charging the emulator:
#   claim first     bill_customer (or bill_period) has claimed, not yet
#                   committed; an UPDATE (or DELETE) of the amount waits for
#                   it, and is then refused with 23001 naming the record's
#                   key and status; the charge is of the amount claimed;
#   change first    an UPDATE of the amount, not yet committed; bill_customer
#                   (or bill_period) waits for it, then claims the new
#                   amount; the charge is of that;
#   at once         30 sessions each change one customer's amount at the
#                   instant bill_period runs: each customer's record holds
#                   the amount its change left, or the change was refused.
# Afterwards each record was charged exactly once at the emulator, of the
# amount the record froze, which is what period_amounts says.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator(latency_ms => 5);
my $node = BillguardNode->dispatching('period_amount_claim_race', $emulator);
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method)
	SELECT 'r' || g, 'cus_r' || g, NULL, 'pm_card_visa' FROM generate_series(1, 34) g;
	INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency)
	SELECT 'r' || g, p, 1000 * g, 'usd' FROM generate_series(1, 34) g, unnest(ARRAY['2031-07', '2031-08']) p;
	INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency)
	SELECT 'r' || g, '2031-09', 100 + g, 'usd' FROM generate_series(5, 34) g});
my $claimer = $node->session;
my $writer = $node->session;
my $frozen = qr/ERROR:  period amount of '(\S+)' for (\S+) is frozen: billing record ([0-9a-f]{32}) claimed it and is (pending|dispatching|completed)/;

# ---- claim first: bill_customer -------------------------------------------------
$claimer->query('BEGIN');
is(($claimer->query(q{SELECT status FROM billguard.bill_customer('r1', '2031-07')}))[0], 'initiated',
	'claim first: bill_customer claims r1 (not committed yet)');
$writer->send(q{UPDATE billguard.period_amounts SET amount_cents = 1500 WHERE customer_id = 'r1' AND billing_period = '2031-07'});
ok($node->waits_for_lock($writer), "claim first: the UPDATE of r1's amount waits for the claim");
$claimer->query('COMMIT');
my (undef, $err) = $writer->done;
like($err, $frozen, 'claim first: once the claim commits, the UPDATE is refused as frozen');
my ($customer, $period, $key) = $err =~ $frozen;
is("$customer/$period/$key", 'r1/2031-07/' . $node->key_of('r1', '2031-07'), 'the refusal names the record by its key');
like($err, qr/DETAIL:  The record charges 1000 usd, as it was claimed; update of its period amount is refused\./,
	'and says what the record charges');

# ---- change first: bill_customer ------------------------------------------------
$writer->query('BEGIN');
$writer->query(q{UPDATE billguard.period_amounts SET amount_cents = 2500 WHERE customer_id = 'r2' AND billing_period = '2031-07'});
$claimer->send(q{SELECT status FROM billguard.bill_customer('r2', '2031-07')});
ok($node->waits_for_lock($claimer), 'change first: bill_customer of r2 waits for the change');
$writer->query('COMMIT');
is(($claimer->done)[0], 'initiated', 'change first: once it commits, bill_customer claims r2');

# ---- claim first: bill_period ---------------------------------------------------
$claimer->query('BEGIN');
like(($claimer->query(q{SELECT initiated FROM billguard.bill_period('2031-07')}))[0], qr/^32$/,
	'claim first: bill_period claims the 32 other customers (not committed yet)');
$writer->send(q{DELETE FROM billguard.period_amounts WHERE customer_id = 'r3' AND billing_period = '2031-07'});
ok($node->waits_for_lock($writer), "claim first: a DELETE of r3's amount waits for bill_period");
$claimer->query('COMMIT');
(undef, $err) = $writer->done;
like($err, $frozen, 'claim first: once bill_period commits, the DELETE is refused as frozen');

# ---- change first: bill_period --------------------------------------------------
$writer->query('BEGIN');
$writer->query(q{UPDATE billguard.period_amounts SET amount_cents = 4500 WHERE customer_id = 'r4' AND billing_period = '2031-08'});
$claimer->send(q{SELECT initiated FROM billguard.bill_period('2031-08')});
ok($node->waits_for_lock($claimer), 'change first: bill_period of 2031-08 waits for the change');
$writer->query('COMMIT');
is(($claimer->done)[0], '34', 'change first: once it commits, bill_period claims all 34');
$claimer->close;
$writer->close;

# ---- at once --------------------------------------------------------------------
$node->q1('CREATE TABLE t130_changes (customer_id text PRIMARY KEY, outcome text NOT NULL)');
my $gate = $node->start_gate;
my @changers = map {
	$node->race_psql(qq{
	DO \$\$
	BEGIN
	  UPDATE billguard.period_amounts SET amount_cents = amount_cents + 50
	   WHERE customer_id = 'r$_' AND billing_period = '2031-09';
	  INSERT INTO t130_changes VALUES ('r$_', 'changed');
	EXCEPTION WHEN restrict_violation THEN
	  INSERT INTO t130_changes VALUES ('r$_', 'refused: ' || SQLERRM);
	END \$\$})
} 5 .. 34;
my $biller = $node->race_psql(q{SELECT billguard.bill_period('2031-09')});
$node->release_gate($gate, 31);
finish_race(@changers, $biller);
is(scalar(grep { $_->{exit} != 0 } @changers, $biller), 0, 'at once: every racing session ran to its end')
  or diag(join("\n", map { $_->{err} } @changers, $biller));
my %outcomes = %{ $node->outcome_counts('t130_changes', 'outcome') };
note(sprintf('at once: %d changes came first, %d were refused', $outcomes{changed} // 0, $outcomes{refused} // 0));
is(($outcomes{changed} // 0) + ($outcomes{refused} // 0), 30, 'at once: each of the 30 changes answered');
is($node->q1(q{
	SELECT count(*) FROM t130_changes c JOIN billguard.billing_records r
	    ON r.customer_id = c.customer_id AND r.billing_period = '2031-09'
	 WHERE r.amount_cents <> 100 + substr(c.customer_id, 2)::int + CASE WHEN c.outcome = 'changed' THEN 50 ELSE 0 END
	    OR (c.outcome <> 'changed'
	        AND c.outcome !~ ('^refused: period amount of ''' || c.customer_id || ''' for 2031-09 is frozen: billing record '
	                          || r.idempotency_key || ' claimed it and is (pending|dispatching|completed)$'))}),
	'0', 'at once: each record holds the amount its change left, or the change was refused naming the record');

# ---- what was charged -----------------------------------------------------------
ok($node->wait_until_settled($_), "every record of $_ settles") for '2031-07', '2031-08', '2031-09';
is($node->q1(q{
	SELECT count(*) FROM billguard.period_amounts p
	  JOIN billguard.billing_records r USING (customer_id, billing_period)
	 WHERE (r.amount_cents, r.currency) = (p.amount_cents, p.currency)}),
	'98', 'each of the 98 records froze exactly what its period amount says now');
is($node->q1(q{SELECT amount_cents FROM billguard.billing_records WHERE customer_id = 'r1' AND billing_period = '2031-07'})
	. '/' . $node->q1(q{SELECT amount_cents FROM billguard.billing_records WHERE customer_id = 'r2' AND billing_period = '2031-07'})
	. '/' . $node->q1(q{SELECT amount_cents FROM billguard.billing_records WHERE customer_id = 'r4' AND billing_period = '2031-08'}),
	'1000/2500/4500', 'the claim-first record kept its amount, the change-first ones took the change');
my %amount_of = map { split /\|/ } split /\n/, $node->q1(q{
	SELECT idempotency_key || '|' || amount_cents FROM billguard.billing_records});
my %charges;
push @{ $charges{ $_->{metadata}{billguard_key} // '' } }, $_ for @{ succeeded_charges($emulator) };
is(scalar(keys %amount_of), 98, '98 records');
is(scalar(grep { @{ $charges{$_} // [] } != 1 } keys %amount_of), 0, 'each was charged exactly once at the emulator');
is(scalar(grep { ($charges{$_}[0]{amount} // -1) != $amount_of{$_} } keys %amount_of), 0,
	'each charge is of the amount its record froze');
is(scalar(grep { !exists $amount_of{$_} } keys %charges), 0, 'no other charge');

$node->stop;
$emulator->stop;
done_testing();
