# The database owner who would become a superuser through schema billguard.
# dbowner, no superuser, owns database billing.
#   - dbowner runs CREATE SCHEMA billguard before the superuser's CREATE
#     EXTENSION billguard, which would install into it: refused (42501,
#     naming the owner), nothing created. Once dbowner has dropped it, the
#     extension creates its own, owned by the superuser: dbowner can create
#     nothing in it.
#   - The attack itself, with CREATE on schema billguard granted to dbowner
#     by mistake: dbowner adds billguard.retry_delay(integer, integer), a
#     better match than the real (integer, double precision) for a call
#     with an integer cap, whose body runs ALTER ROLE dbowner SUPERUSER.
#     The emulator answers 503 to the first charges, so the dispatcher (the
#     bootstrap superuser) schedules their retries through retry_delay: the
#     planted overload never runs, dbowner is no superuser, and every
#     customer is charged once.
#   - A database installed with 0.1.0 (released before the check) into a
#     schema dbowner made, holding a function of dbowner's: ALTER EXTENSION
#     billguard UPDATE refuses it until a superuser owns the schema and the
#     function is gone.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('schema_owner_attack', $emulator, "billguard.database = 'billing'");
$node->safe_psql('postgres', 'CREATE ROLE dbowner LOGIN NOSUPERUSER');
$node->safe_psql('postgres', 'CREATE DATABASE billing OWNER dbowner');

sub as_dbowner {
	my ($sql) = @_;
	return $node->psql('billing', $sql, extra_params => [ '-U', 'dbowner' ]);
}
sub in_billing { my ($sql) = @_; return $node->safe_psql('billing', $sql) }

# ---- a schema billguard made beforehand ----------------------------------------------

my ($rc, $out, $err) = as_dbowner('CREATE SCHEMA billguard');
is($rc, 0, 'dbowner creates schema billguard first') or diag($err);
($rc, $out, $err) = $node->psql('billing', 'CREATE EXTENSION billguard');
isnt($rc, 0, "the superuser's CREATE EXTENSION billguard is refused");
like($err, qr/ERROR:  schema billguard exists already and is owned by dbowner, who is not a superuser/,
	'because dbowner owns the schema');
is(in_billing(q{SELECT count(*) FROM pg_extension WHERE extname = 'billguard'}), '0', 'no extension was created');
is(in_billing(q{SELECT count(*) FROM pg_class WHERE relnamespace = 'billguard'::regnamespace}), '0',
	'and no table in the schema');

($rc, $out, $err) = as_dbowner('DROP SCHEMA billguard');
is($rc, 0, 'dbowner drops the schema again') or diag($err);
in_billing('CREATE EXTENSION IF NOT EXISTS billguard');
is(in_billing(q{SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'billguard'}), 'postgres',
	'CREATE EXTENSION creates schema billguard, owned by the superuser');
($rc, $out, $err) = as_dbowner(q{BEGIN; CREATE FUNCTION billguard.retry_delay(integer, integer) RETURNS interval
	LANGUAGE sql AS $$SELECT interval '1 s'$$; ROLLBACK});
like($err, qr/ERROR:  permission denied for schema billguard/, 'dbowner can create nothing in it');

# ---- the overload, with CREATE granted by mistake --------------------------------------

in_billing('GRANT USAGE, CREATE ON SCHEMA billguard TO dbowner');
($rc, $out, $err) = as_dbowner(q{
	CREATE TABLE public.overload_log (role name, superuser boolean, at timestamptz);
	GRANT INSERT ON public.overload_log TO PUBLIC;
	CREATE FUNCTION billguard.retry_delay(integer, integer) RETURNS interval LANGUAGE plpgsql
	  SET search_path = pg_catalog, pg_temp AS $$
	DECLARE
	  su boolean := (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
	BEGIN
	  INSERT INTO public.overload_log VALUES (current_user, su, clock_timestamp());
	  IF su THEN EXECUTE 'ALTER ROLE dbowner SUPERUSER'; END IF;
	  RETURN interval '1 s';
	END $$});
is($rc, 0, 'dbowner plants billguard.retry_delay(integer, integer)') or diag($err);

# Control: a superuser's call with an integer cap resolves to the overload,
# which takes over.
is(in_billing(q{SET search_path = pg_catalog, pg_temp; SELECT billguard.retry_delay(1, 900)}), '00:00:01',
	'control: billguard.retry_delay(1, 900) calls the overload');
is(in_billing(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'}), 't',
	'control: run by a superuser, it made dbowner a superuser');
in_billing(q{ALTER ROLE dbowner NOSUPERUSER; TRUNCATE public.overload_log});

my $accounts = 10;
in_billing(qq{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || g, 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, $accounts) g});
$emulator->add_fault(kind => 'status', status => 503, count => $accounts);
is(in_billing(q{SELECT initiated FROM billguard.bill_period('2026-09')}), $accounts, "$accounts records claimed");
ok(wait_until('every record completed', 90, sub {
	in_billing(q{SELECT count(*) FROM billguard.billing_records WHERE status = 'completed'}) eq $accounts }),
	'every record completes');
is(in_billing(q{SELECT count(*) FROM billguard.journal
	WHERE event_type = 'BillingFailed' AND event ->> 'http_status' = '503' AND NOT (event ->> 'terminal')::boolean}),
	$accounts, "the dispatcher scheduled $accounts retries after a 503");
is(in_billing('SELECT count(*) FROM public.overload_log'), '0', 'the planted overload never ran');
is(in_billing(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'dbowner'}), 'f', 'dbowner is no superuser');
is(scalar(@{ succeeded_charges($emulator) }), $accounts, "$accounts charges at the emulator, one per customer");

# ---- a database installed before the check: ALTER EXTENSION UPDATE refuses it --------------

$node->safe_psql('postgres', 'CREATE DATABASE legacy OWNER dbowner');
sub in_legacy { my ($sql) = @_; return $node->psql('legacy', $sql, extra_params => [ '-U', $_[1] // 'postgres' ]) }
($rc, $out, $err) = in_legacy(q{CREATE SCHEMA billguard;
	CREATE FUNCTION billguard.retry_delay(integer, integer) RETURNS interval LANGUAGE sql AS $$SELECT interval '1 s'$$},
	'dbowner');
is($rc, 0, 'legacy: dbowner creates schema billguard and a function in it') or diag($err);
($rc, $out, $err) = in_legacy(q{CREATE EXTENSION billguard VERSION '0.1.0'});
is($rc, 0, 'legacy: 0.1.0, released before the check, installs into it') or diag($err);
($rc, $out, $err) = in_legacy('ALTER EXTENSION billguard UPDATE');
like($err, qr/ERROR:  schema billguard is owned by dbowner, who is not a superuser/,
	'legacy: ALTER EXTENSION billguard UPDATE refuses the schema dbowner owns');
in_legacy('ALTER SCHEMA billguard OWNER TO postgres');
($rc, $out, $err) = in_legacy('ALTER EXTENSION billguard UPDATE');
like($err, qr/ERROR:  schema billguard holds functions billguard did not create: billguard\.retry_delay\(integer, integer\)/,
	'legacy: and then the function dbowner added to it');
in_legacy('DROP FUNCTION billguard.retry_delay(integer, integer)');
($rc, $out, $err) = in_legacy('ALTER EXTENSION billguard UPDATE');
is($rc, 0, 'legacy: with the schema the superuser\'s and the function gone, the update goes through') or diag($err);

$node->stop;
$emulator->stop;
done_testing();
