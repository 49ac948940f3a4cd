#!/usr/bin/env perl
# compare.pl, the judge of the regression suite as a peer, on results made up
# for it: it must fail on every difference it is not told to allow.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Path qw(make_path);
use File::Temp qw(tempdir);
use Test::More;

my $compare = dirname(__FILE__) . '/compare.pl';
my $root    = tempdir(CLEANUP => 1);
my $run     = 0;

# An excerpt of opr_sanity as a plain server prints it.
my $plain_opr_sanity = <<'OUT';
-- currently, no built-in functions should be SECURITY DEFINER;
-- this might change in future, but there will probably never be many.
SELECT p1.oid, p1.proname
FROM pg_proc AS p1
WHERE prosecdef
ORDER BY 1;
 oid | proname 
-----+---------
(0 rows)

-- Check that all immutable functions are marked parallel safe
SELECT p1.oid, p1.proname
FROM pg_proc AS p1
WHERE provolatile = 'i' AND proparallel = 'u';
 oid | proname 
-----+---------
(0 rows)

CREATE TABLE t (a int);
DROP TABLE t;
OUT

# What the same excerpt prints when billguard's SECURITY DEFINER functions
# join the first listing.
my $listed = $plain_opr_sanity =~ s/ oid \| proname \n-----\+---------\n\(0 rows\)\n/  oid  |    proname    \n-------+---------------\n 16492 | bill_customer\n 16496 | bill_period\n(2 rows)\n/r;

sub results {
	my ($name, $text) = @_;
	my $dir = "$root/$name";
	make_path("$dir/results");
	open my $fh, '>', "$dir/results/opr_sanity.out" or die $!;
	print $fh $text;
	return $dir;
}

# Runs compare.pl on a plain and another run's opr_sanity; returns its exit
# status and output.
sub judge {
	my ($mode, $other, $plain) = @_;
	$run++;
	my $plain_dir = results("plain$run", $plain // $plain_opr_sanity);
	my $other_dir = results("other$run", $other);
	open my $tests, '>', "$root/tests" or die $!;
	print $tests "opr_sanity\n";
	close $tests;
	open my $objects, '>', "$root/objects" or die $!;
	print $objects "16492\tbill_customer\n16496\tbill_period\n16526\terror_text\n";
	close $objects;
	my $output = `'$compare' --tests '$root/tests' --mode $mode --objects '$root/objects' '$plain_dir' '$other_dir'`;
	return ($? >> 8, $output);
}

my ($status, $output);

($status) = judge('exact', $plain_opr_sanity);
is($status, 0, 'exact: the same output passes');

($status, $output) = judge('exact', $plain_opr_sanity =~ s/DROP TABLE t;\n/DROP TABLE t;\nNOTICE:  hello\n/r);
is($status, 1, 'exact: an extra notice fails');
like($output, qr/^\+NOTICE:  hello$/m, 'exact: and the line is shown');

($status) = judge('exact', $plain_opr_sanity =~ s/ oid \| proname \n/ oid  | proname\n/r);
is($status, 1, 'exact: a difference of padding alone fails');

($status) = judge('extension', $plain_opr_sanity);
is($status, 0, 'extension: the same output passes');

($status, $output) = judge('extension', $listed);
is($status, 0, 'extension: billguard\'s rows in a listing it may join pass');
like($output, qr/^allowed opr_sanity:/m, 'extension: and are reported as allowed');

($status, $output) = judge('extension',
	$plain_opr_sanity =~ s/WHERE provolatile = 'i' AND proparallel = 'u';\n oid \| proname \n-----\+---------\n\(0 rows\)\n/WHERE provolatile = 'i' AND proparallel = 'u';\n  oid  |  proname   \n-------+------------\n 16526 | error_text\n(1 row)\n/r);
is($status, 1, 'extension: billguard\'s row in a sanity check it fails (a wrong label) fails');
like($output, qr/not a listing billguard may join/, 'extension: and says why');

($status) = judge('extension', $listed =~ s/\(2 rows\)/(3 rows)/r);
is($status, 1, 'extension: a row count that does not match the rows fails');

($status) = judge('extension', $listed =~ s/ 16496 \| bill_period\n/ 16496 | bill_period\n 16497 | not_ours\n/r =~ s/\(2 rows\)/(3 rows)/r);
is($status, 1, 'extension: a row naming no billguard object fails');

($status) = judge('extension', $listed =~ s/ 16496 \| bill_period\n/ 16496 | bill_period\nNOTICE:  billguard sees bill_period\n/r =~ s/\(2 rows\)/(3 rows)/r);
is($status, 1, 'extension: a notice naming billguard inside a listing it may join fails');

($status) = judge('extension', $plain_opr_sanity =~ s/DROP TABLE t;\n/DROP TABLE t;\nNOTICE:  billguard: dropped t\n/r);
is($status, 1, 'extension: an extra notice fails, even one naming billguard');

($status) = judge('extension', $plain_opr_sanity =~ s/DROP TABLE t;\n/DROP TABLE t;\nERROR:  billguard refuses\n/r);
is($status, 1, 'extension: a refused DDL fails');

($status) = judge('extension', $plain_opr_sanity =~ s/CREATE TABLE t \(a int\);\n//r);
is($status, 1, 'extension: a missing line fails');

# A nondeterministic test: the other run may match either plain run.
{
	$run++;
	my $p1 = results("plain$run", $plain_opr_sanity);
	my $p2 = results("plain-again$run", "$plain_opr_sanity-- the other outcome\n");
	my $other = results("other$run", "$plain_opr_sanity-- the other outcome\n");
	my $third = results("third$run", "$plain_opr_sanity-- a third outcome\n");
	system("'$compare' --tests '$root/tests' --mode exact '$p1,$p2' '$other' >/dev/null");
	is($? >> 8, 0, 'exact: an output one of two plain runs printed passes');
	system("'$compare' --tests '$root/tests' --mode exact '$p1,$p2' '$third' >/dev/null");
	is($? >> 8, 1, 'exact: an output neither plain run printed fails');
}

# A test without results (it did not run) fails.
{
	$run++;
	my $p1 = results("plain$run", $plain_opr_sanity);
	make_path("$root/empty$run/results");
	system("'$compare' --tests '$root/tests' --mode exact '$p1' '$root/empty$run' >/dev/null");
	is($? >> 8, 1, 'a test without results fails');
}

done_testing();
