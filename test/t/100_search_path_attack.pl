# The search_path attack on the dispatcher, replayed: no object a
# non-superuser plants may run with the dispatcher's privileges. The
# dispatcher runs as the bootstrap superuser. attacker, who is no superuser,
# owns the billing database, so in PostgreSQL 15 attacker may CREATE in its
# schema public and set the database's search_path. attacker plants traps in
# public that beat pg_catalog's functions and operators for the statements
# the dispatcher runs:
#   - jsonb_build_object(text, integer, text, text, text, text, text,
#     timestamptz): an exact match for the ChargeAttempted event of
#     claim_due_records, which beats pg_catalog's variadic one;
#   - now(), random(), the operators = (text, text) and || (text, text):
#     exact ties, which win once ALTER DATABASE billing SET search_path =
#     public, pg_catalog puts public first;
# each trap records who ran it and, run by a superuser, makes attacker a
# superuser. A control first shows a trap does run as the superuser: a
# superuser session calls a function without a pinned search_path. Then
# billing runs through the dispatcher (connected under the hostile
# database settings), before and after ANALYZE (plans are made again): no
# trap ever runs, attacker is no superuser, and every charge is made once.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('search_path_attack', $emulator, "billguard.database = 'billing'");

# The test's own statements in billing resolve names in pg_catalog only, so
# that they never spring a trap themselves.
sub as_superuser {
	my ($sql) = @_;
	return $node->safe_psql('billing', "SET search_path = pg_catalog, pg_temp;\n$sql");
}

sub as_attacker {
	my ($sql) = @_;
	return $node->safe_psql('billing', $sql, extra_params => [ '-U', 'attacker' ]);
}

$node->safe_psql('postgres', 'CREATE ROLE attacker LOGIN NOSUPERUSER');
$node->safe_psql('postgres', 'CREATE DATABASE billing OWNER attacker');
as_superuser('CREATE EXTENSION billguard');
as_superuser(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || g, 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, 20) g});

# ---- the traps ------------------------------------------------------------------------

as_attacker(q{
	CREATE TABLE public.trap_log (trap text, role name, superuser boolean, backend_type text, at timestamptz);
	GRANT INSERT ON public.trap_log TO PUBLIC;
	-- Records the trap and, run by a superuser, takes over.
	CREATE FUNCTION public.trap_fired(trap text) RETURNS void LANGUAGE plpgsql
	  SET search_path = pg_catalog, pg_temp AS $$
	DECLARE
	  su boolean := (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
	BEGIN
	  INSERT INTO public.trap_log VALUES (trap, current_user, su,
	    (SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid()), clock_timestamp());
	  IF su THEN EXECUTE 'ALTER ROLE attacker SUPERUSER'; END IF;
	END $$;

	CREATE FUNCTION public.jsonb_build_object(text, integer, text, text, text, text, text, timestamptz)
	  RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
	  PERFORM public.trap_fired('jsonb_build_object');
	  RETURN pg_catalog.jsonb_build_object($1, $2, $3, $4, $5, $6, $7, $8);
	END $$;
	CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
	BEGIN
	  PERFORM public.trap_fired('now');
	  RETURN pg_catalog.now();
	END $$;
	CREATE FUNCTION public.random() RETURNS double precision LANGUAGE plpgsql AS $$
	BEGIN
	  PERFORM public.trap_fired('random');
	  RETURN pg_catalog.random();
	END $$;
	CREATE FUNCTION public.trap_texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
	  PERFORM public.trap_fired('=');
	  RETURN pg_catalog.texteq($1, $2);
	END $$;
	CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.trap_texteq);
	CREATE FUNCTION public.trap_textcat(text, text) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN
	  PERFORM public.trap_fired('||');
	  RETURN pg_catalog.textcat($1, $2);
	END $$;
	CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.trap_textcat);
	ALTER DATABASE billing SET search_path = public, pg_catalog;
});
is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'"), 'f',
	'attacker is no superuser');

# The dispatcher connects under the database's new settings.
$node->restart;

# ---- control: an unpinned function called by a superuser springs the trap ----------

$node->safe_psql('billing', q{
	CREATE FUNCTION public.unpinned_attempt_event() RETURNS jsonb LANGUAGE plpgsql AS $$
	BEGIN
	  RETURN jsonb_build_object('attempt', 1, 'action', 'charge'::text, 'idempotency_key', 'k'::text, 'at', now());
	END $$;
	SELECT public.unpinned_attempt_event();
});
is(as_superuser("SELECT string_agg(DISTINCT trap || ':' || role || ':' || superuser, ',') FROM public.trap_log"),
	'jsonb_build_object:postgres:true,now:postgres:true',
	'control: without a pinned search_path, the traps run as the superuser');
is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'"), 't',
	'control: and make attacker a superuser');
as_superuser(q{
	ALTER ROLE attacker NOSUPERUSER;
	DROP FUNCTION public.unpinned_attempt_event();
	TRUNCATE public.trap_log;
});

# ---- the attack on the dispatcher -------------------------------------------------------

# Billing in $period through the dispatcher; every record completed.
sub bill_and_settle {
	my ($period) = @_;
	is(as_superuser("SELECT initiated FROM billguard.bill_period('$period')"), '20', "$period: 20 billings initiated");
	ok(wait_until("$period settled", 60, sub {
		as_superuser(qq{SELECT count(*) FROM billguard.billing_records
		                 WHERE billing_period = '$period' AND status <> 'completed'}) eq '0' }),
		"$period: every record completed by the dispatcher");
}

ok(wait_until('the dispatcher of billing', 30, sub {
	as_superuser('SELECT worker_running FROM billguard.dispatch_status') eq 't' }),
	'a dispatcher serves billing, connected under search_path = public, pg_catalog');
bill_and_settle('2026-08');
as_superuser('ANALYZE billguard.billing_records; ANALYZE billguard.journal');
bill_and_settle('2026-09');

is(as_superuser('SELECT count(*) FROM public.trap_log'), '0', 'no trap ever ran');
is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'"), 'f',
	'attacker is still no superuser');
my $by_key = charges_by_key($emulator);
is(scalar(keys %$by_key), 40, 'the emulator holds charges for 40 keys');
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one charge per key');

$node->stop;
$emulator->stop;
done_testing();
