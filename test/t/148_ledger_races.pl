# The spend-cap ledger's decisions racing each other in real concurrent
# sessions, so no interleaving spends past a cap: an Idempotency-Key's decisions are serialised by its
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
#   tight        the same on 40 keys of 1 USD against a cap of 5 USD, so that
#                releases free room that other sessions' reservations take
# After each, the budget's committed sum is the sum of its reservations not
# released and within the cap, the settled and reserved sums it shows are
# the sums of its reservations by status, and every decision wrote one
# audit row. And a success settling a reservation neither locks nor updates
# the budget's row: it settles while another session holds that row's lock
# (a release, which lowers the committed sum, waits for it).
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use BillguardTest;
use BillguardNode;

my $node = BillguardNode->preloaded('ledger_races');

# One budget per scenario; auth() and settle() call the ledger with its key.
$node->q1(q{
CREATE TABLE race_keys AS SELECT 'x'::text AS period, ''::text AS key_id WITH NO DATA;
-- A session remembers the attempt its last auth() of a key made, as the
-- proxy's request does, and settle() answers that attempt (or, in a session
-- that made none, the key's latest).
CREATE FUNCTION auth(period text, idem text, amount bigint) RETURNS text LANGUAGE sql AS $$
  SELECT a.decision || coalesce(':' || a.http_status, '')
         || left(set_config('race.k' || md5(period || idem), coalesce(a.attempt::text, ''), false), 0)
    FROM billguard.vault_keys k,
         billguard.vault_authorize(k.secret_sha256, 'POST', '/v1/payment_intents', idem,
                                   repeat('a', 64), amount, 'usd', 'cus_race') a
   WHERE k.key_id = (SELECT key_id FROM race_keys r WHERE r.period = auth.period)
$$;
-- Settles only a reservation that exists (one row out per settle made).
CREATE FUNCTION settle(period text, idem text, upstream integer) RETURNS SETOF text LANGUAGE sql AS $$
  SELECT billguard.vault_settle(r.key_id, idem, upstream,
                                CASE upstream WHEN 402 THEN 'card_error' WHEN 500 THEN 'api_error' END,
                                CASE WHEN upstream = 200 THEN 'pi_' || idem END, '{"id": "pi"}', 'req_race',
                                coalesce(nullif(current_setting('race.k' || md5(period || idem), true), '')::integer,
                                         v.attempts))
    FROM race_keys r, billguard.vault_reservations v
   WHERE r.period = settle.period
     AND v.billing_period = settle.period AND v.idempotency_key = settle.idem AND v.attempts > 0
$$;
});
sub new_budget {
	my ($period, $cap_usd) = @_;
	$node->q1(qq{INSERT INTO race_keys SELECT '$period', key_id FROM billguard.issue_vault_key(
	        'stripe', '$period', $cap_usd, ARRAY['/v1/payment_intents'], now() + interval '400 days', false)});
}
# "settled/reserved" of the budget, and the same sums over its reservations.
sub sums {
	my ($period) = @_;
	return $node->q1(qq{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '$period'});
}
# The budget's committed sum must be the sum of its reservations not
# released, and never more than its cap.
sub committed_is_counted {
	my ($period, $label) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', qq{
	  SELECT b.committed_cents, (SELECT coalesce(sum(r.amount_cents), 0) FROM billguard.vault_reservations r
	                              WHERE r.billing_period = b.billing_period AND r.status <> 'released'), b.cap_cents
	    FROM billguard.vault_budgets b WHERE b.billing_period = '$period'});
	is($err, '', "$label: the budget has a committed sum");
	my ($committed, $counted, $cap) = split /\|/, $out, -1;
	$_ //= 'none' for $committed, $counted, $cap;
	is($committed, $counted, "$label: the committed sum ($committed) is the sum of the reservations not released");
	ok($committed ne 'none' && $committed <= $cap, "$label: the committed sum is within the cap ($cap)");
}
sub reservation_sums {
	my ($period) = @_;
	return $node->q1(qq{SELECT coalesce(sum(amount_cents) FILTER (WHERE status = 'settled'), 0) || '/'
	                 || coalesce(sum(amount_cents) FILTER (WHERE status = 'reserved'), 0)
	               FROM billguard.vault_reservations WHERE billing_period = '$period'});
}
sub decisions {
	my ($period) = @_;
	return $node->q1(qq{SELECT string_agg(d, ' ' ORDER BY d) FROM (
	               SELECT decision || coalesce(':' || http_status, '') || '=' || count(*) AS d
	                 FROM billguard.vault_audit WHERE billing_period = '$period' AND decision <> 'issued'
	                GROUP BY decision, http_status) x});
}
# Runs each list of statements in a session of its own, all at once;
# returns every line they printed.
sub race {
	my ($label, @sessions) = @_;
	my $gate = $node->start_gate;
	my @racers = map { $node->race_psql(@$_) } @sessions;
	$node->release_gate($gate, scalar @racers);
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
is($node->q1(q{SELECT string_agg(status, ' ' ORDER BY idempotency_key) FROM billguard.vault_reservations WHERE billing_period = '2050-02'}),
	'settled settled settled settled settled', 'flip: every key ends settled');
is(sums('2050-02'), '500/0', 'flip: each key counted once: settled 500 cents, nothing reserved');
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2050-02' AND decision <> 'issued'}),
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
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2050-04' AND decision <> 'issued'}),
	scalar(@out), 'mixed: one audit row per decision made');

# ---- random decisions on 40 keys against a cap they exceed ---------------------
# Stripe refuses the r- keys (402) and accepts the a- keys, so that no
# success arrives after a release (which is counted whatever the cap says).
new_budget('2050-05', 5);
my @tight = map {
	[ map {
		my $k = (rand() < 0.5 ? 'tight-a-' : 'tight-r-') . (1 + int(rand(20)));
		my $op = int(rand(4));
		$op < 2 ? qq{SELECT auth('2050-05', '$k', 100)}
		  : qq{SELECT settle('2050-05', '$k', ${\ ($op == 3 ? 500 : $k =~ /-a-/ ? 200 : 402) })} } 1 .. 20 ]
} 1 .. 30;
@out = race('tight', @tight);
like(tally(@out), qr/refused:429=\d+/, 'tight: the cap refused some reservations');
is($node->q1(q{SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2050-05' AND decision <> 'issued'}),
	scalar(@out), 'tight: one audit row per decision made');

for my $period ('2050-01', '2050-02', '2050-03', '2050-04', '2050-05') {
	is(sums($period), reservation_sums($period), "$period: the budget's sums are the sums of its reservations");
	committed_is_counted($period, $period);
}

# ---- a success settles while another session holds the budget's row lock --------
new_budget('2050-06', 10);
is(join(' ', map { $node->q1(qq{SELECT auth('2050-06', '$_', 300)}) } qw(lock-ok lock-refused)), 'reserved reserved',
	'lock: two reservations');
my $row_version = q{SELECT xmin || ' ' || ctid FROM billguard.vault_budgets WHERE billing_period = '2050-06'};
my $before = $node->q1($row_version);
my $holder = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c', "SET application_name = 'budget_holder'",
	  '-c', q{BEGIN; SELECT FROM billguard.vault_budgets WHERE billing_period = '2050-06' FOR UPDATE; SELECT pg_sleep(600)} ],
	'>', \my $holder_out, '2>', \my $holder_err);
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'budget_holder' AND wait_event = 'PgSleep'})
  or die 'the holder did not lock the budget';
# Fails within the lock_timeout, rather than hanging, where a settle waits.
sub settle_beside_holder {
	my ($idem, $upstream, $timeout) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET lock_timeout = '$timeout'; SELECT settle('2050-06', '$idem', $upstream)");
	return $rc == 0 ? $out : ($err =~ /(canceling statement due to lock timeout)/)[0] // $err;
}
is(settle_beside_holder('lock-ok', 200, '10s'), 'settled',
	'lock: a success settles while another session holds the budget\'s row lock');
is(settle_beside_holder('lock-refused', 402, '200ms'), 'canceling statement due to lock timeout',
	'lock: a release, which lowers the committed sum, waits for that lock');
$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'budget_holder'});
$holder->finish;
is($node->q1($row_version), $before, 'lock: the success did not update the budget\'s row');
is($node->q1(q{SELECT string_agg(status, ' ' ORDER BY idempotency_key) FROM billguard.vault_reservations WHERE billing_period = '2050-06'}),
	'settled reserved', 'lock: the success is settled, the timed-out release changed nothing');
is(sums('2050-06'), '300/300', 'lock: the budget shows 300 cents settled, 300 reserved');
committed_is_counted('2050-06', 'lock');

$node->stop;
done_testing();
