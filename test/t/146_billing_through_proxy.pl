# Billing through the proxy: the dispatcher, with
# billguard.vault_issuer_token_file set and billguard.api_base pointing at a
# real billguard-proxy (whose ledger shares the billing database, as tests
# may), bills a period with the period's vault key:
#   - an issuer token file open to others pauses the dispatcher with the
#     reason, never the token; chmod 600 and a reload resume it;
#   - a period whose cap (total x headroom) is past the proxy's
#     --issuer-max-period-usd pauses the dispatcher with the proxy's 403
#     reason, creating no budget; a higher ceiling and a reload resume it;
#   - one POST /keys per period (one VaultKeyIssued, one 'issued' audit row),
#     cap = the period's claimed total x billguard.vault_cap_headroom, exact;
#   - every record completed, one charge per key at the emulator, every
#     charge and search of the period sent with that key (the proxy's audit);
#   - records claimed later in the period are sent with the kept key, never
#     a second one; an expired key is replaced by one joining the period's
#     budget at its cap (the proxy's 409); another period gets its own, and
#     so does each currency: a EUR record pauses the dispatcher while the
#     proxy has no EUR ceiling for the issuer token, and completes on a EUR
#     key, within a EUR budget, once it has one; an expired EUR key is
#     replaced by one joining the EUR budget at its cap (the 409, in EUR);
#   - the key is kept where only superusers read it; neither it nor the
#     issuer token ever reaches the server log.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('billing_through_proxy', BillguardNode::dispatcher_conf());
# A ceiling below the period's cap (222.31 USD below), raised further down.
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	issuer_max_period_usd => '200');

# The issuer token, group-readable at first.
my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token, 0640);
$node->reload_with(api_base => $proxy->url(''), vault_issuer_token_file => $token_file);
ok(wait_until('the dispatcher to pause', 20, sub {
	$node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /vault_issuer_token_file/ }),
	'an issuer token file with group access: the dispatcher is paused');
my $reason = $node->q1('SELECT pause_reason FROM billguard.dispatch_status');
like($reason, qr/billguard\.vault_issuer_token_file has group or world access \(mode 0640\)/,
	'dispatch_status says why');
unlike($reason, qr/\Q${\ $proxy->issuer_token }\E|\Q$token_file\E/, 'without the token or its path');

$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'), 1000 + g, 'usd', 'pm_card_visa'
	  FROM generate_series(1, 20) g});
my $total = $node->q1('SELECT sum(amount_cents) FROM billguard.accounts');
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '20', '2026-08 claimed while paused');
sleep 1;
is($emulator->stats->{requests} // 0, 0, 'nothing was sent while paused');

# A token the proxy does not know: POST /keys is refused (401), the
# dispatcher pauses with the proxy's reason, sends no charge.
write_secret_file($node->basedir . '/issuer.token', 'issuer-' . ('x' x 32));
$node->reload;
ok(wait_until('the dispatcher to pause on the refused token', 20, sub {
	$node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /HTTP 401/ }),
	'a token the proxy refuses: paused');
like($node->q1('SELECT pause_reason FROM billguard.dispatch_status'),
	qr/^the proxy issued no vault key for 2026-08 \(HTTP 401: POST \/keys needs the issuer or the admin token\)/,
	"... with the proxy's reason");
is($emulator->stats->{requests} // 0, 0, '... and nothing sent');

# The right token, but the period's cap is past the issuer's ceiling: 403,
# the dispatcher pauses with the proxy's reason, nothing is created or sent.
write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);
$node->reload;
ok(wait_until('the dispatcher to pause on the ceiling', 20, sub {
	$node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /HTTP 403/ }),
	'a period cap past --issuer-max-period-usd: paused');
like($node->q1('SELECT pause_reason FROM billguard.dispatch_status'),
	qr/^the proxy issued no vault key for 2026-08 \(HTTP 403: the issuer token may create a budget of at most 200\.00 USD \(--issuer-max-period-usd\), not 222\.31 USD for billing_period 2026-08\)/,
	"... with the proxy's reason, naming the ceiling and the cap asked");
like(slurp_file($node->logfile), qr/paused: the proxy issued no vault key for 2026-08 \(HTTP 403: /, '... in the server log too');
is($node->q1('SELECT count(*) FROM billguard.vault_budgets'), '0', '... and no budget was created');
is($emulator->stats->{requests} // 0, 0, '... nor anything sent');

$proxy->stop;
$proxy->{issuer_max_period_usd} = '1000';
$proxy->restart;
$node->reload;
ok($node->wait_until_settled('2026-08'), 'with a higher ceiling and a reload, the period is billed');
is($node->q1("SELECT string_agg(status || '=' || n, ',') FROM (SELECT status, count(*) n FROM billguard.billing_records WHERE billing_period = '2026-08' GROUP BY 1) s"),
	'completed=20', 'every record completed');
my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{ $node->key_of("cust_$_", '2026-08') } // [] } == 1 } map { sprintf '%06d', $_ } 1 .. 20), 20,
	'one charge per key at the emulator');

# One key for the period, at the period's total x 1.10, exactly.
my $cap_cents = $node->q1("SELECT ceil($total * 1.10)");
is($node->q1(q{SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler'
                 AND event_type = 'VaultKeyIssued' AND event ->> 'billing_period' = '2026-08'}), '1',
	'one VaultKeyIssued for the period');
is($node->q1("SELECT event ->> 'cap_usd' FROM billguard.journal WHERE event_type = 'VaultKeyIssued'"),
	sprintf('%.2f', $cap_cents / 100), "its cap is the period's total ($total cents) x 1.10");
my ($key_id, $vault_key) = split /\|/, $node->q1("SELECT key_id || '|' || vault_key FROM billguard.vault_credentials WHERE billing_period = '2026-08'");
like($vault_key, qr/^vk_test_[A-Za-z0-9]{32}$/, 'the vault key is kept for the period');
is($node->q1(qq{SELECT count(*) FILTER (WHERE key_id = '$key_id') || '/' || count(*) FROM billguard.vault_audit
                 WHERE decision IN ('reserved', 'forwarded', 'replayed', 'refused')}), '20/20',
	'every request of the period was sent with that key');
is($node->q1(qq{SELECT allowed_endpoints::text FROM billguard.vault_keys WHERE key_id = '$key_id'}),
	'{/v1/payment_intents,/v1/payment_intents/search}', 'scoped to the charge endpoint and its search');

# Records claimed later in the period: the kept key, no second one.
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	VALUES ('cust_late', 'cus_late', 1000, 'usd', 'pm_card_visa')});
is($node->bill('cust_late', '2026-08'), 'initiated', 'a record claimed after the key was issued');
ok($node->wait_until_settled('2026-08'), '... is billed');
is($node->status_of('cust_late', '2026-08'), 'completed', '... completed');
is($node->q1("SELECT count(*) FROM billguard.vault_audit WHERE decision = 'issued'"), '1',
	'... with the kept key: still one key issued');

# The kept key expires (the ledger says so: a period billed long after its
# end): the next record of the period meets 401 vault_key_expired, and the
# dispatcher obtains a new key, which names the period's new total, gets the
# proxy's 409 and joins the budget at its cap. The attempt does not count.
$node->q1(qq{UPDATE billguard.vault_keys SET expires_at = now() - interval '1 second' WHERE key_id = '$key_id'});
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	VALUES ('cust_expired', 'cus_expired', 1000, 'usd', 'pm_card_visa')});
is($node->bill('cust_expired', '2026-08'), 'initiated', 'a record of the period once its key has expired');
ok($node->wait_until_settled('2026-08'), '... is billed');
is($node->record_of('cust_expired', '2026-08') =~ s/\|[^|]*\|/|/r, 'completed|1',
	'... completed, the attempt that met the expired key not counted');
my $renewed = $node->q1("SELECT key_id FROM billguard.vault_credentials WHERE billing_period = '2026-08'");
isnt($renewed, $key_id, '... with a new key for the period');
is($node->q1(qq{SELECT count(*) || ' ' || count(DISTINCT (vendor, billing_period, currency))
                  FROM billguard.vault_keys WHERE billing_period = '2026-08'}), '2 1',
	'... which joined the period\'s one budget');
is($node->q1("SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2026-08'"), $cap_cents,
	'... at its cap');

# Another period, its own keys: one per currency it bills. A EUR record
# needs a EUR budget, which the issuer token may create only up to a ceiling
# for EUR: without one the dispatcher pauses with the proxy's 403, and with
# one (--issuer-max-period) the record completes on a key of its own.
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	VALUES ('cust_eur', 'cus_eur', 1000, 'eur', 'pm_card_visa')});
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-09')"), '23', '2026-09 claimed');
ok(wait_until('the dispatcher to pause on EUR', 20, sub {
	$node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /in eur/ }),
	'no EUR ceiling for the issuer token: paused');
like($node->q1('SELECT pause_reason FROM billguard.dispatch_status'),
	qr/^the proxy issued no vault key for 2026-09 in eur \(HTTP 403: the issuer token may create no budget in EUR \(the proxy has no ceiling for it: --issuer-max-period AMOUNT:eur\)\)/,
	"... with the proxy's reason");
is($node->q1(q{SELECT count(*) FROM billguard.vault_budgets WHERE currency = 'eur'}), '0', '... and no EUR budget');
$proxy->stop;
$proxy->{issuer_max_period} = ['100.00:eur'];
$proxy->restart;
$node->reload;
ok($node->wait_until_settled('2026-09'), 'with a EUR ceiling and a reload, 2026-09 is billed');
is($node->q1(q{SELECT string_agg(currency || '=' || status || '=' || n, ',' ORDER BY currency) FROM (
                 SELECT currency, status, count(*) n FROM billguard.billing_records
                  WHERE billing_period = '2026-09' GROUP BY 1, 2) s}),
	'eur=completed=1,usd=completed=22', 'the EUR record completed, and so did the USD ones');
is(scalar @{ charges_by_key($emulator)->{ $node->key_of('cust_eur', '2026-09') } // [] }, 1,
	'... one EUR charge at the emulator');
is($node->q1(q{SELECT currency || ' ' || cap_cents || ' ' || committed_cents FROM billguard.vault_budgets
                WHERE billing_period = '2026-09' AND currency = 'eur'}), 'eur 1100 1000',
	"... within the period's EUR budget: its EUR total x 1.10");
is($node->q1(q{SELECT string_agg(k.currency, ',' ORDER BY k.currency) FROM billguard.vault_credentials k
                WHERE billing_period = '2026-09'}), 'eur,usd', 'the dispatcher keeps a key per currency of the period');
is($node->q1(q{SELECT string_agg(event ->> 'billing_period' || coalesce(':' || (event ->> 'currency'), ''), ',' ORDER BY seq_nr)
                 FROM billguard.journal WHERE event_type = 'VaultKeyIssued'}), '2026-08,2026-08,2026-09,2026-09:eur',
	'one key per period and currency (and the renewed one)');

# The EUR key expires, and a EUR record claimed since asks a new one for a
# larger total: the proxy's 409 names the EUR budget's cap, in EUR, and the
# new key joins it there.
$node->q1(q{UPDATE billguard.vault_keys SET expires_at = now() - interval '1 second' WHERE currency = 'eur'});
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	VALUES ('cust_eur_late', 'cus_eur_late', 100, 'eur', 'pm_card_visa')});
is($node->bill('cust_eur_late', '2026-09'), 'initiated', 'a EUR record once the EUR key has expired');
ok($node->wait_until_settled('2026-09'), '... is billed');
is($node->status_of('cust_eur_late', '2026-09'), 'completed', '... completed');
is($node->q1(q{SELECT count(*) || ' ' || count(DISTINCT (vendor, billing_period, currency))
                 FROM billguard.vault_keys WHERE billing_period = '2026-09' AND currency = 'eur'}), '2 1',
	'... with a new EUR key, which joined the one EUR budget');
is($node->q1(q{SELECT cap_cents || ' ' || committed_cents FROM billguard.vault_budgets
                WHERE billing_period = '2026-09' AND currency = 'eur'}), '1100 1100', '... at its cap, now spent');
like(slurp_file($node->logfile),
	qr/the proxy already has a budget for 2026-09 with a cap of 11\.00 EUR, not the 12\.10 EUR asked/,
	"... as the log says, in EUR");

# Only superusers read the keys.
$node->q1('CREATE ROLE billing_app_146 LOGIN; GRANT USAGE ON SCHEMA billguard TO billing_app_146');
my ($rc, $out, $err) = $node->psql('postgres', 'SELECT vault_key FROM billguard.vault_credentials',
	extra_params => [ '-U', 'billing_app_146' ]);
like($err, qr/permission denied for table vault_credentials/, 'another role may not read the vault keys');
($rc, $out, $err) = $node->psql('postgres', "SELECT coalesce(current_setting('billguard.vault_issuer_token_file', true), 'hidden')",
	extra_params => [ '-U', 'billing_app_146' ]);
isnt($out, $token_file, "nor the issuer token file's path");

$proxy->stop;
$node->stop;
my $log = slurp_file($node->logfile);
like($log, qr/obtained vault key \Q$key_id\E for 2026-08, cap \d+\.\d\d USD/, 'the log names the key issued, by its id');
like($log, qr/the vault key \Q$key_id\E of 2026-08 expired; obtaining a new one/, '... and the expired one it replaced');
unlike($log, qr/\Q$vault_key\E/, 'the vault key never appears in the server log');
unlike($log, qr/\Q${\ $proxy->issuer_token }\E/, 'nor the issuer token');
unlike($proxy->log_text, qr/\Q$vault_key\E|\Q${\ $proxy->issuer_token }\E/, "nor in the proxy's");
$emulator->stop;
done_testing();
