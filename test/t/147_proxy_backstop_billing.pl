# The backstop with the dispatcher doing the billing (a restored backup, and
# the guards in front of the proxy bypassed): a real billguard-proxy (its ledger in
# database postgres), the emulator upstream, and a dispatcher in each
# billing database (billguard.database unset) billing through the proxy
# with billguard.vault_issuer_token_file.
#   - bill1 bills 100 accounts of 100.00 USD for 2026-08: one vault key,
#     cap = 100 x 100.00 x 1.10 = 11000.00 USD, 100 charges;
#   - restored backup: bill2, restored from a dump of bill1 taken right after
#     its accounts were created (before the period was billed), replaces
#     bill1 (retired; bill2 adopted as the billing database) and bills the
#     period again past the emulator's idempotency TTL (it has forgotten
#     every key): every request is answered from the proxy's ledger
#     (Idempotent-Replayed), 0 new charges, bill2's records complete with
#     bill1's charge ids;
#   - guards bypassed: bill3, restored from the same dump and adopted in
#     place of bill2, with one account more, bills the period under another
#     key namespace (every key new):
#     its key request names another cap (101 accounts), the proxy's 409
#     names the budget's cap, and the dispatcher joins it at that cap (and
#     says so in the log); 10 charges pass (the headroom), every other one
#     is refused with 429 (spend_cap_pending, retried, while the cap is held
#     by charges in flight; spend_cap_exceeded once those have settled),
#     audited with customer, amount and key id, and ends blocked (terminal,
#     out of the queue, BillingBlocked, the cap in its last_error); the
#     emulator's total never passes the cap.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('proxy_backstop_billing',
	"billguard.max_requests_per_second = 2000",
	"billguard.max_inflight = 32",
	"billguard.poll_interval = '200ms'",
	"billguard.request_timeout = '5s'");
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);

sub in_db { my ($db, $sql) = @_; return $node->safe_psql($db, $sql) }

# Waits until no record of 2026-08 in $db is open.
sub settled_in {
	my ($db) = @_;
	return wait_until("2026-08 settled in $db", 180, sub {
		in_db($db, q{SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2026-08'
		             AND status IN ('pending', 'dispatching', 'unknown')}) eq '0';
	}, interval => 0.2, explain => sub { "$db: " . statuses($db) });
}

sub statuses {
	my ($db) = @_;
	return in_db($db, q{SELECT string_agg(status || '=' || n, ',' ORDER BY status)
	                      FROM (SELECT status, count(*) n FROM billguard.billing_records
	                             WHERE billing_period = '2026-08' GROUP BY 1) s});
}

sub emulator_total {
	my $total = 0;
	$total += $_->{amount} for @{ succeeded_charges($emulator) };
	return $total;
}

# ---- bill1: 100 accounts, dumped before the period is billed -----------------------------------

in_db('postgres', 'CREATE DATABASE bill1');
in_db('bill1', 'CREATE EXTENSION billguard');
in_db('bill1', q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'), 10000, 'usd', 'pm_card_visa'
	  FROM generate_series(1, 100) g});
my $dump = $node->basedir . '/before_2026-08.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('bill1') ]);
is($err, '', 'bill1 dumped before 2026-08 is billed');

is(in_db('bill1', "SELECT initiated FROM billguard.bill_period('2026-08')"), '100', 'bill1: 2026-08 claimed');
ok(settled_in('bill1'), 'bill1: the period is billed through the proxy');
is(statuses('bill1'), 'completed=100', 'bill1: every record completed');
is(scalar(@{ succeeded_charges($emulator) }), 100, 'the emulator holds 100 charges');
my $cap_cents = 100 * 10000 * 110 / 100;
is(in_db('postgres', q{SELECT string_agg(cap_cents || '', ',') FROM billguard.vault_budgets WHERE billing_period = '2026-08'}),
	$cap_cents, "one budget for the period, cap = expected x 1.10 ($cap_cents cents)");
my %charge_of = map { split /\|/ } split /\n/, in_db('bill1',
	q{SELECT customer_id || '|' || charge_id FROM billguard.billing_records WHERE billing_period = '2026-08'});

# ---- restored backup, past the emulator's memory -----------------------------------------------

$emulator->configure(idempotency_ttl => 1);
sleep 1.5;
in_db('postgres', 'CREATE DATABASE bill2');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('bill2'), $dump ]);
is($err, '', 'bill2 restored from the dump taken before the period was billed');
is(in_db('bill2', 'SELECT count(*) FROM billguard.billing_records'), '0', 'bill2 knows nothing of 2026-08');
is(in_db('bill2', 'SELECT count(*) FROM billguard.vault_credentials'), '0', '... nor of its vault key (never dumped)');
in_db('postgres', 'ALTER DATABASE bill1 ALLOW_CONNECTIONS false');
like(in_db('bill2', 'SELECT billguard.adopt_database()'), qr/^adopted/, 'bill1 retired, bill2 adopted as the billing database');
my $replayed_before = in_db('postgres', q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'replayed'});
is(in_db('bill2', "SELECT initiated FROM billguard.bill_period('2026-08')"), '100', 'bill2: 2026-08 claimed again');
ok(settled_in('bill2'), 'bill2: the period is billed again through the proxy');
is(statuses('bill2'), 'completed=100', 'bill2: every record completed');
my %charge_again = map { split /\|/ } split /\n/, in_db('bill2',
	q{SELECT customer_id || '|' || charge_id FROM billguard.billing_records WHERE billing_period = '2026-08'});
is(scalar(grep { ($charge_again{$_} // '') eq $charge_of{$_} } keys %charge_of), 100, '... with the original charge ids');
is(in_db('bill2', q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingCompleted'
                     AND (event ->> 'replayed')::boolean}), '100', 'every answer was Idempotent-Replayed');
is(in_db('postgres', q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'replayed'}) - $replayed_before, 100,
	"... from the proxy's ledger");
is(scalar(@{ succeeded_charges($emulator) }), 100, '0 new charges at the emulator');
is(in_db('postgres', q{SELECT count(*) FROM billguard.vault_keys WHERE billing_period = '2026-08'}) . '|'
   . in_db('postgres', q{SELECT count(*) FROM billguard.vault_budgets WHERE billing_period = '2026-08'}), '2|1',
	"bill2's key was issued again and joined the period's one budget");

# ---- guards bypassed: every key new ------------------------------------------------------------

in_db('postgres', 'CREATE DATABASE bill3');
($out, $err) = run_command([ 'pg_restore', '-d', $node->connstr('bill3'), $dump ]);
is($err, '', 'bill3 restored from the same dump');
in_db('bill3', q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
                 VALUES ('cust_000101', 'cus_000101', 10000, 'usd', 'pm_card_visa')});
in_db('postgres', 'ALTER DATABASE bill2 ALLOW_CONNECTIONS false');
like(in_db('bill3', 'SELECT billguard.adopt_database()'), qr/^adopted/, 'bill2 retired, bill3 adopted as the billing database');
is(in_db('bill3', "SET billguard.key_namespace = 'other-ns'; SELECT initiated FROM billguard.bill_period('2026-08')"), '101',
	'bill3: 2026-08 claimed under another key namespace, 101 accounts');
is(in_db('bill3', q{SELECT count(*) FROM billguard.billing_records r
                     WHERE r.idempotency_key = billguard.idempotency_key(r.customer_id, r.billing_period, 'akka-billing')}), '0',
	'... every key new');
ok(settled_in('bill3'), 'bill3: every record settled');
is(statuses('bill3'), 'blocked=91,completed=10', 'bill3: 10 charges passed (the headroom), 91 records blocked');
is(scalar(@{ succeeded_charges($emulator) }), 110, 'the emulator holds 10 more charges');
my $charged = emulator_total();
cmp_ok($charged, '<=', $cap_cents, "the emulator's total ($charged cents) never passes the cap ($cap_cents)");
is(in_db('postgres', q{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2026-08'}),
	"$charged/0", "the budget's settled sum is the emulator's total, nothing reserved");

my $bill3_key = in_db('bill3', q{SELECT key_id FROM billguard.vault_credentials WHERE billing_period = '2026-08'});
like($bill3_key, qr/^vkey_/, "bill3 holds a vault key for the period");
is(in_db('postgres', qq{SELECT count(*) FROM billguard.vault_audit
                         WHERE decision = 'refused' AND http_status = 429 AND billing_period = '2026-08'
                           AND key_id = '$bill3_key' AND customer LIKE 'cus\\_%' AND amount_cents = 10000
                           AND reason = 'spend cap exceeded for billing_period 2026-08'}), '91',
	'each refusal is in vault_audit with customer, amount and key id');
my $blocked_customers = in_db('bill3', q{SELECT string_agg(stripe_customer, ',' ORDER BY stripe_customer)
                                         FROM billguard.billing_records WHERE status = 'blocked'});
is(in_db('postgres', qq{SELECT string_agg(customer, ',' ORDER BY customer) FROM billguard.vault_audit
                         WHERE decision = 'refused' AND key_id = '$bill3_key'
                           AND reason = 'spend cap exceeded for billing_period 2026-08'}), $blocked_customers,
	'... the customers of the blocked records');
is(in_db('bill3', q{SELECT count(*) FROM billguard.billing_records
                     WHERE status = 'blocked' AND next_attempt_at IS NULL
                       AND last_error LIKE '429 invalid_request_error/spend_cap_exceeded: spend cap exceeded for billing_period 2026-08; the period''s vault cap is 11000.00 USD (vault key vkey\_%)'}),
	'91', 'blocked records are out of the queue, the cap in their last_error');
is(in_db('postgres', qq{SELECT count(*) FROM billguard.vault_audit
                         WHERE decision = 'refused' AND key_id = '$bill3_key' AND http_status = 429
                           AND reason <> 'spend cap exceeded for billing_period 2026-08'
                           AND reason NOT LIKE 'the spend cap of billing_period 2026-08 is held by charges in flight or of unknown outcome; %'}),
	'0', 'every other refusal was spend_cap_pending, while the cap was held by charges in flight: those were sent again');
is(in_db('bill3', q{SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingBlocked'}), '91',
	'... each journaled as BillingBlocked');
is(in_db('bill3', q{SELECT count(DISTINCT billguard.entity_state(persistence_id) ->> 'status') || ' '
                         || min(billguard.entity_state(persistence_id) ->> 'status')
                      FROM billguard.journal WHERE event_type = 'BillingBlocked'}), '1 blocked',
	'... whose folded state is blocked');
my $refusals = in_db('postgres', q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'refused'});
sleep 1;    # several poll intervals: a blocked record is never sent again
is(in_db('postgres', q{SELECT count(*) FROM billguard.vault_audit WHERE decision = 'refused'}), $refusals,
	'no blocked record is sent again');
is(in_db('postgres', q{SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2026-08'}), $cap_cents,
	'the cap never changed');

$proxy->stop;
$node->stop;
my $log = slurp_file($node->logfile);
like($log, qr/the proxy already has a budget for 2026-08 with a cap of 11000\.00 USD, not the 11110\.00 USD asked/,
	"bill3's dispatcher says it joined the existing budget at its cap");
like($log, qr/cust_\d+\/2026-08 is blocked: spend cap exceeded for billing_period 2026-08; the period's vault cap is 11000\.00 USD/,
	'each blocked record is logged with the cap');
$emulator->stop;
done_testing();
