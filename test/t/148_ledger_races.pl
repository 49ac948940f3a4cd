# The spend-cap ledger's decisions racing each other in real concurrent
# sessions (issue 8): an Idempotency-Key's decisions are serialised by its
# own lock and the budget's row is locked last, so these interleavings must
# still leave exact sums:
#   new key      30 sessions authorize one new Idempotency-Key at once: one
#                reservation, 29 reuses, counted once
#   settle       30 sessions settle that key as a success at once: settled
#                once, nothing left reserved
#   flip         30 sessions each authorize, release (402), authorize again
#                and settle (200) the same 5 keys at once: every key ends
#                settled, each counted once
#   cap          40 sessions authorize 200 distinct 50-cent charges at once
#                against 50 USD: exactly 100 reserved, 100 refused with 429
#   mixed        30 sessions run random authorize and settle (200, 402, 500,
#                no answer) calls on 8 shared keys
# After each, the budget's settled and reserved sums equal the sums of its
# reservations by status, and every decision wrote one audit row.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;

my $node = billguard_node('ledger_races');
sub q1 { my ($sql) = @_; return scalar $node->safe_psql('postgres', $sql) }

# One budget per scenario; auth() and settle() call the ledger with its key.
q1(q{
CREATE TABLE race_keys AS SELECT 'x'::text AS period, ''::text AS key_id WITH NO DATA;
CREATE FUNCTION auth(period text, idem text, amount bigint) RETURNS text LANGUAGE sql AS $$
  SELECT a.decision || coalesce(':' || a.http_status, '')
    FROM billguard.vault_keys k,
         billguard.vault_authorize(k.secret_sha256, 'POST', '/v1/payment_intents', idem,
                                   repeat('a', 64), amount, 'usd', 'cus_race') a
   WHERE k.key_id = (SELECT key_id FROM race_keys r WHERE r.period = auth.period)
$$;
-- Settles only a reservation that exists (one row out per settle made).
CREATE FUNCTION settle(period text, idem text, upstream integer) RETURNS SETOF text LANGUAGE sql AS $$
  SELECT billguard.vault_settle(r.key_id, idem, upstream,
                                CASE upstream WHEN 402 THEN 'card_error' WHEN 500 THEN 'api_error' END,
                                CASE WHEN upstream = 200 THEN 'pi_' || idem END, '{"id": "pi"}', 'req_race')
    FROM race_keys r
   WHERE r.period = settle.period
     AND EXISTS (SELECT FROM billguard.vault_reservations v
                  WHERE v.billing_period = settle.period AND v.idempotency_key = settle.idem)
$$;
});
sub new_budget {
	my ($period, $cap_usd) = @_;
	q1(qq{INSERT INTO race_keys SELECT '$period', key_id FROM billguard.issue_vault_key(
	        'stripe', '$period', $cap_usd, ARRAY['/v1/payment_intents'], now() + interval '400 days', false)});
}
# "settled/reserved" of the budget, and the same sums over its reservations.
sub sums {
	my ($period) = @_;
	return q1(qq{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_budgets WHERE billing_period = '$period'});
}
sub reservation_sums {
	my ($period) = @_;
	return q1(qq{SELECT coalesce(sum(amount_cents) FILTER (WHERE status = 'settled'), 0) || '/'
	                 || coalesce(sum(amount_cents) FILTER (WHERE status = 'reserved'), 0)
	               FROM billguard.vault_reservations WHERE billing_period = '$period'});
}
sub decisions {
	my ($period) = @_;
	return q1(qq{SELECT string_agg(d, ' ' ORDER BY d) FROM (
	               SELECT decision || coalesce(':' || http_status, '') || '=' || count(*) AS d
	                 FROM billguard.vault_audit WHERE billing_period = '$period' AND decision <> 'issued'
	                GROUP BY decision, http_status) x});
}
# Runs each list of statements in a session of its own, all at once;
# returns every line they printed.
sub race {
	my ($label, @sessions) = @_;
	my $gate = start_gate($node);
	my @racers = map { race_psql($node, @$_) } @sessions;
	release_gate($node, $gate, scalar @racers);
	finish_race(@racers);
	is(scalar(grep { $_->{exit} != 0 } @racers), 0, "$label: every session ran without an error")
	  or diag(join("\n", map { $_->{err} } grep { $_->{exit} != 0 } @racers));
	return map { split /\n/, $_->{out} } @racers;
}
sub tally { my %n; $n{$_}++ for @_; return join(' ', map { "$_=$n{$_}" } sort keys %n) }

# ---- one new Idempotency-Key, 30 sessions at once, then 30 settles at once ----
new_budget('2050-01', 1000);
is(tally(race('new key', map { [ q{SELECT auth('2050-01', 'same', 500)} ] } 1 .. 30)), 'reserved=1 reused=29',
	'new key: one session reserves, 29 reuse the reservation');
is(sums('2050-01'), '0/500', 'new key: counted once');
is(tally(race('settle', map { [ q{SELECT settle('2050-01', 'same', 200)} ] } 1 .. 30)), 'settled=30',
	'settle: 30 successes of one key at once ...');
is(sums('2050-01'), '500/0', 'settle: ... are settled once, nothing left reserved');
is(decisions('2050-01'), 'reserved=1 reused=29 settled:200=30', 'settle: every decision is audited once');

# ---- authorize, release, authorize, settle: 5 keys, 30 sessions -------------
new_budget('2050-02', 1000);
my @flip = map { my $k = "flip-$_"; (qq{SELECT auth('2050-02', '$k', 100)}, qq{SELECT settle('2050-02', '$k', 402)},
	qq{SELECT auth('2050-02', '$k', 100)}, qq{SELECT settle('2050-02', '$k', 200)}) } 1 .. 5;
race('flip', map { [ @flip ] } 1 .. 30);
is(q1(q{SELECT string_agg(status, ' ' ORDER BY idempotency_key) FROM billguard.vault_reservations WHERE billing_period = '2050-02'}),
	'settled settled settled settled settled', 'flip: every key ends settled');
is(sums('2050-02'), '500/0', 'flip: each key counted once: settled 500 cents, nothing reserved');
is(q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2050-02' AND decision <> 'issued'}),
	30 * 20, 'flip: one audit row per decision');

# ---- 200 distinct charges against a cap of 100 --------------------------------
new_budget('2050-03', 50);
my @answers = race('cap', map { my $s = $_; [ map { qq{SELECT auth('2050-03', 'cap-$s-$_', 50)} } 1 .. 5 ] } 1 .. 40);
is(tally(@answers), 'refused:429=100 reserved=100', 'cap: of 200 charges at once, exactly 100 reserved, 100 get 429');
is(sums('2050-03'), '0/5000', 'cap: reserved = the cap, never more');
race('cap settle', map { my $s = $_; [ map { qq{SELECT settle('2050-03', 'cap-$s-$_', 200)} } 1 .. 5 ] } 1 .. 40);
is(sums('2050-03'), '5000/0', 'cap: settled = 5,000 cents');

# ---- random decisions on 8 shared keys ----------------------------------------
new_budget('2050-04', 100000);
srand(148);
my @mixed = map {
	[ map {
		my $k = 'mix-' . (1 + int(rand(8)));
		my $op = int(rand(6));
		$op < 2 ? qq{SELECT auth('2050-04', '$k', 700)}
		  : qq{SELECT settle('2050-04', '$k', ${\ (200, 402, 500, 0)[$op - 2] })} } 1 .. 20 ]
} 1 .. 30;
my @out = race('mixed', @mixed);
is(sums('2050-04'), reservation_sums('2050-04'), 'mixed: the budget\'s sums are the sums of its reservations');
is(q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2050-04' AND decision <> 'issued'}),
	scalar(@out), 'mixed: one audit row per decision made');

for my $period ('2050-01', '2050-02', '2050-03') {
	is(sums($period), reservation_sums($period), "$period: the budget's sums are the sums of its reservations");
}

$node->stop;
done_testing();
