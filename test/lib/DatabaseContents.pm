# What a database of billguard holds, read so that two databases (one
# before and one after an update, a pg_upgrade or a restore) compare as
# text: every row of every table of the extension, and the schema as
# pg_dump writes it.
package DatabaseContents;

use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Exporter 'import';

our @EXPORT = qw(table_rows rows_of rows_intact schema_of same_schema first_difference);

# Every row of every table of schema billguard in $database as text, in key
# order, by the columns each table has now: { table => { columns, rows } }.
# %expected: for a table whose values a step changes on purpose, the select
# list (given the columns) that reads them now as they must be after it.
sub table_rows {
	my ($node, $database, %expected) = @_;
	my %rows;
	for my $table (split /\n/, $node->safe_psql($database, q{
			SELECT c.relname FROM pg_class c
			 WHERE c.relnamespace = 'billguard'::regnamespace AND c.relkind = 'r' ORDER BY 1})) {
		my $columns = $node->safe_psql($database, qq{
			SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
			 WHERE attrelid = 'billguard.$table'::regclass AND attnum > 0 AND NOT attisdropped});
		my $select = $expected{$table} ? $expected{$table}->($columns) : $columns;
		$rows{$table} = { columns => $columns, rows => rows_of($node, $database, $table, $select) };
	}
	return \%rows;
}

sub rows_of {
	my ($node, $database, $table, $select) = @_;
	return $node->safe_psql($database,
		"SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM (SELECT $select FROM billguard.$table) t");
}

# Every row is as table_rows read it, by the columns its table had; the
# tables named in @except are left out (the caller checks them itself).
sub rows_intact {
	my ($node, $database, $before, $what, @except) = @_;
	my %except = map { ($_ => 1) } @except;
	for my $table (grep { !$except{$_} } sort keys %$before) {
		is(rows_of($node, $database, $table, $before->{$table}{columns}), $before->{$table}{rows},
			"$what: every row of billguard.$table is intact");
	}
}

# pg_dump leaves an extension's objects out of a plain dump; the binary
# upgrade mode includes them. Masked: OIDs and transaction ids it
# preserves, the per-run \restrict key and the configuration table list
# (compare pg_extension.extconfig as a set).
sub schema_of {
	my ($node, $database) = @_;
	my ($dump, $errors) = run_command(
		[ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($database) ]);
	die "pg_dump $database: $errors" if $errors;
	return join("\n", map {
		s/binary_upgrade_create_empty_extension\(.*\);/binary_upgrade_create_empty_extension(...);/r
		  =~ s/relfrozenxid = '\d+', relminmxid = '\d+'/relfrozenxid = ?, relminmxid = ?/r
		  =~ s/WHERE oid = '\d+'/WHERE oid = ?/r
	} grep { !/binary_upgrade_set_next_|^\\(un)?restrict / } split /\n/, $dump);
}

# $database has the schema of $fresh (a fresh install): the same dump, the
# same tables dumped with their data under the same conditions. $normalize,
# if given, rewrites both dumps before they are compared.
sub same_schema {
	my ($node, $database, $fresh, $what, $normalize) = @_;
	my ($ours, $theirs) = map { $normalize ? $normalize->($_) : $_ } schema_of($node, $database), schema_of($node, $fresh);
	cmp_ok(length($theirs), '>', 10000, "$what: the dump holds the extension's objects");
	is($ours, $theirs, "$what: pg_dump --schema-only of it is that of a fresh install")
	  or diag(first_difference($ours, $theirs));
	my $config_tables = q{
		SELECT string_agg(c::regclass::text || ' ' || coalesce(w, ''), ', ' ORDER BY c::regclass::text)
		  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u (c, w) WHERE e.extname = 'billguard'};
	is($node->safe_psql($database, $config_tables), $node->safe_psql($fresh, $config_tables),
		"$what: the same tables are dumped with their data, with the same conditions");
}

# The first lines where two dumps differ, for the diagnostics.
sub first_difference {
	my ($a, $b) = @_;
	my @a = split /\n/, $a;
	my @b = split /\n/, $b;
	my $i = 0;
	$i++ while $i < @a && $i < @b && $a[$i] eq $b[$i];
	my $from = $i > 5 ? $i - 5 : 0;
	return "first difference at line $i:\n--- first\n" . join("\n", @a[$from .. ($i + 10 < $#a ? $i + 10 : $#a)])
	  . "\n--- second\n" . join("\n", @b[$from .. ($i + 10 < $#b ? $i + 10 : $#b)]);
}

1;
