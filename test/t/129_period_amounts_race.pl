# A usage period billed while the application's metering still writes what
# customers owe: 450 usage-only accounts (no fixed amount) and 60 accounts
# with a fixed amount. 150 of the usage-only ones have their period amount
# before the period is billed; for the other 300, three sessions write it
# while a fourth bills the period again and again (bill_period every few
# milliseconds, each call its own transaction) and the dispatcher sends
# what is claimed. Each writer inserts a customer's amount, commits, waits a
# moment and revises it (amount + 7, another description), in a transaction
# of its own, as metering that corrects itself would. Afterwards:
#   - the race met: some revisions came before the claim and were billed,
#     some after it and were refused with 23001, naming the record;
#   - every customer with a period amount has exactly one record, of the
#     amount the table holds at the end (what was billed is what it says),
#     every fixed account one of its amount;
#   - every record was charged exactly once at the emulator, of its amount,
#     in its currency, with its description and metadata;
#   - a usage-only account that never got an amount was never billed.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $period = '2031-05';
my $emulator = start_emulator(latency_ms => 5);
my $node = BillguardNode->dispatching('period_amounts_race', $emulator, 'billguard.max_requests_per_second = 400');
$node->q1(qq{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'use_' || lpad(g::text, 4, '0'), 'cus_use' || g, NULL, 'usd', 'pm_card_visa'
	  FROM generate_series(1, 451) g;
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'fix_' || lpad(g::text, 4, '0'), 'cus_fix' || g, 900 + g, 'eur', 'pm_card_visa'
	  FROM generate_series(1, 60) g;
	-- use_0001..0150 are metered before the period is billed; use_0451 never.
	INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description, metadata)
	SELECT 'use_' || lpad(g::text, 4, '0'), '$period', 1000 + g * 3, CASE g % 3 WHEN 0 THEN 'jpy' ELSE 'usd' END,
	       'May usage of use_' || g, jsonb_build_object('meter', 'early', 'calls', (g * 11)::text)
	  FROM generate_series(1, 150) g;
	CREATE TABLE t129_writes (customer_id text PRIMARY KEY, revised text NOT NULL);
	CREATE TABLE t129_done (writer int PRIMARY KEY)});

# Writer w meters use_0151..0450 with g % 3 = w: insert, commit, a moment,
# revise, commit (or be told the amount is frozen).
my $writer_sql = sub {
	my ($w) = @_;
	return qq{
	DO \$\$
	DECLARE
	  g int;
	  c text;
	  outcome text;
	BEGIN
	  FOR g IN SELECT s FROM generate_series(151, 450) s WHERE s % 3 = $w ORDER BY s LOOP
	    c := 'use_' || lpad(g::text, 4, '0');
	    INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description, metadata)
	    VALUES (c, '$period', 2000 + g, CASE g % 2 WHEN 0 THEN 'eur' ELSE 'usd' END, 'May usage of ' || c,
	            jsonb_build_object('meter', 'late', 'writer', '$w'));
	    COMMIT;
	    PERFORM pg_sleep(0.005 + random() * 0.02);
	    BEGIN
	      UPDATE billguard.period_amounts SET amount_cents = amount_cents + 7, description = 'May usage of ' || c || ', revised'
	       WHERE customer_id = c AND billing_period = '$period';
	      outcome := 'revised';
	    EXCEPTION WHEN restrict_violation THEN
	      outcome := 'refused: ' || SQLERRM;
	    END;
	    INSERT INTO t129_writes VALUES (c, outcome);
	    COMMIT;
	  END LOOP;
	  INSERT INTO t129_done VALUES ($w);
	END \$\$};
};
my $gate = $node->start_gate;
my @writers = map { $node->race_psql($writer_sql->($_)) } 0 .. 2;
my $biller = $node->race_psql(qq{
	DO \$\$
	DECLARE
	  calls int := 0;
	BEGIN
	  LOOP
	    EXIT WHEN (SELECT count(*) FROM t129_done) = 3;
	    PERFORM billguard.bill_period('$period');
	    COMMIT;
	    calls := calls + 1;
	    PERFORM pg_sleep(0.03);
	  END LOOP;
	  RAISE NOTICE 'bill_period called % times while metering wrote', calls;
	END \$\$});
$node->release_gate($gate, 4);
finish_race(@writers, $biller);
is($_->{exit}, 0, 'a racing session ran to its end') or diag($_->{err}) for @writers, $biller;
note($biller->{err} =~ /(bill_period called \d+ times[^\n]*)/ ? $1 : $biller->{err});
my $last = $node->q1("SELECT initiated || '/' || below_minimum FROM billguard.bill_period('$period')");
note("the last bill_period, after metering: initiated/below_minimum $last");

# The race met.
my %outcomes = %{ $node->outcome_counts('t129_writes', 'revised') };
note(sprintf('revisions: %d billed, %d refused', $outcomes{revised} // 0, $outcomes{refused} // 0));
cmp_ok($outcomes{revised} // 0, '>', 0, 'some revisions came before their claim');
cmp_ok($outcomes{refused} // 0, '>', 0, 'some came after it and were refused');
is(($outcomes{revised} // 0) + ($outcomes{refused} // 0), 300, 'each of the 300 revisions was answered');
is($node->q1(q{
	SELECT count(*) FROM t129_writes w
	 WHERE w.revised LIKE 'refused:%'
	   AND w.revised !~ ('^refused: period amount of ' || quote_literal(w.customer_id)
	                     || ' for 2031-05 is frozen: billing record '
	                     || billguard.idempotency_key(w.customer_id, '2031-05')
	                     || ' claimed it and is (pending|dispatching|completed)$')}),
	'0', "every refusal names the record's key and its status");

ok($node->wait_until_settled($period), 'every record of the period settles');

# Each customer billed once, of what the table says.
is($node->records_of($period), '510', '510 records: 450 metered and 60 fixed accounts, none for the one never metered');
is($node->q1(qq{SELECT count(*) FROM billguard.billing_records WHERE customer_id = 'use_0451'}), '0',
	'the usage-only account without an amount was never claimed');
is($node->q1(qq{
	SELECT count(*) FROM billguard.period_amounts p
	  JOIN billguard.billing_records r ON r.customer_id = p.customer_id AND r.billing_period = p.billing_period
	 WHERE p.billing_period = '$period'
	   AND (r.amount_cents, r.currency, r.description, r.metadata) = (p.amount_cents, p.currency, p.description, p.metadata)}),
	'450', "each metered customer's record holds exactly its period amount as the table ends");
is($node->q1(q{
	SELECT count(*) FROM t129_writes w JOIN billguard.billing_records r USING (customer_id)
	 WHERE (w.revised = 'revised') <> (r.description LIKE '%, revised')}),
	'0', 'a revision is in the record exactly when it was not refused');
is($node->q1(qq{
	SELECT count(*) FROM billguard.billing_records r JOIN billguard.accounts a USING (customer_id)
	 WHERE r.billing_period = '$period' AND a.customer_id LIKE 'fix\\_%'
	   AND r.amount_cents = a.amount_cents AND r.currency = a.currency AND r.description IS NULL}),
	'60', 'each fixed account was billed its own amount');
is($node->statuses_of($period), 'completed=510', 'all 510 completed');

# What the emulator charged.
my %record = map { my ($k, @rest) = split /\|/, $_, -1; ($k => \@rest) } split /\n/, $node->q1(qq{
	SELECT idempotency_key || '|' || amount_cents || '|' || currency || '|' || coalesce(description, '') || '|'
	       || coalesce(metadata ->> 'meter', '') || '|' || customer_id
	  FROM billguard.billing_records WHERE billing_period = '$period'});
# The ledger lists the charges; Stripe's own answer for each says its description.
my %charges;
push @{ $charges{ $_->{metadata}{billguard_key} // '' } }, $emulator->get("/v1/payment_intents/$_->{id}")->{json}
  for @{ succeeded_charges($emulator) };
is(scalar(grep { @{ $charges{$_} // [] } != 1 } keys %record), 0, 'every record was charged exactly once');
is(scalar(grep { !exists $record{$_} } keys %charges), 0, 'no charge without a record');
my @wrong = grep {
	my ($amount, $currency, $description, $meter, $customer) = @{ $record{$_} };
	my $charge = $charges{$_}[0] // {};
	!($charge->{amount} == $amount && $charge->{currency} eq $currency
	  && ($charge->{description} // '') eq ($description eq '' ? "billguard $customer $period" : $description)
	  && ($charge->{metadata}{meter} // '') eq $meter && ($charge->{metadata}{customer_id} // '') eq $customer)
} keys %record;
is(scalar(@wrong), 0, "each charge is of its record's amount, currency, description and metadata")
  or diag(explain([ map { { record => $record{$_}, charge => $charges{$_} } } @wrong[0 .. ($#wrong < 2 ? $#wrong : 2)] ]));

$node->stop;
$emulator->stop;
done_testing();
