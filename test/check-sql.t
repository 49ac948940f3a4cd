#!/usr/bin/env perl
# test/check-sql.pl on copies of the repository's SQL, each broken in one
# way: it passes on the repository as it is and fails, saying why, on every
# break of one of its rules.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Copy qw(copy);
use File::Path qw(make_path remove_tree);
use File::Temp qw(tempdir);
use Cwd qw(abs_path);
use Test::More;

my $repo  = abs_path(dirname(__FILE__) . '/..');
my $check = "$repo/test/check-sql.pl";
my $work  = tempdir(CLEANUP => 1);
my ($development) = slurp("$repo/Makefile") =~ /^EXTVERSION\s*=\s*(\S+)/m;
my @released = sort map { m{billguard--([\d.]+)\.sql\.in$} ? $1 : () } glob("$repo/sql/billguard--*.sql.in");
my $release = $released[-1];    # the last release, frozen as a template

sub slurp {
	my ($path) = @_;
	open my $fh, '<', $path or die "$path: $!";
	local $/;
	return scalar <$fh>;
}

sub spew {
	my ($path, $text) = @_;
	make_path(dirname($path));
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
}

# A fresh copy of the Makefile and sql/, broken by $break; check-sql's exit
# status and what it said.
my $copies = 0;
sub check_broken {
	my ($break) = @_;
	my $root = "$work/copy" . ++$copies;
	make_path("$root/sql");
	copy("$repo/Makefile", "$root/Makefile") or die $!;
	system('cp', '-R', "$repo/sql/.", "$root/sql") == 0 or die 'cp failed';
	unlink glob("$root/sql/billguard--*.sql"), glob("$root/sql/*.tmp");
	copy("$repo/sql/billguard--0.1.0.sql", "$root/sql/billguard--0.1.0.sql") or die $!;
	$break->("$root/sql");
	my $said = `'$^X' '$check' '$root' 2>&1`;
	my $status = $? >> 8;
	remove_tree($root);
	return ($status, $said);
}

sub fails_with {
	my ($what, $break, $expected) = @_;
	my ($status, $said) = check_broken($break);
	isnt($status, 0, "$what: check-sql fails");
	like($said, $expected, "$what: and says why") or diag($said);
	note($said) if $ENV{SHOW};
}

my ($status, $said) = check_broken(sub { });
is($status, 0, 'an unbroken copy passes') or diag($said);
like($said, qr/released scripts unchanged/, 'and says what it checked');

# A function and a view of the development version; a function new in the
# version after the last release, for the rules of upgrades.
my $function = 'udfs/retry_period';
my $view     = 'views/dispatch_status';
my $upgrade  = "billguard--$release--$development.sql.in";

fails_with('latest.sql edited without a snapshot', sub {
	my ($sql) = @_;
	spew("$sql/$function/latest.sql", slurp("$sql/$function/latest.sql") . "-- edited\n");
}, qr/sql\/udfs\/retry_period\/latest\.sql differs from its newest snapshot, \Q$release\E\.sql/);

fails_with('a view\'s latest.sql edited without a snapshot', sub {
	my ($sql) = @_;
	spew("$sql/$view/latest.sql", slurp("$sql/$view/latest.sql") =~ s/worker_pid/dispatcher_pid/r);
}, qr/sql\/views\/dispatch_status\/latest\.sql differs from its newest snapshot/);

fails_with('a new function with no snapshot', sub {
	my ($sql) = @_;
	spew("$sql/udfs/brand_new/latest.sql", "CREATE OR REPLACE FUNCTION billguard.brand_new() RETURNS int LANGUAGE sql RETURN 1;\n");
	spew("$sql/install/99_new.sql", "\\ir ../udfs/brand_new/latest.sql\n");
}, qr/sql\/udfs\/brand_new: latest\.sql has no snapshot: a new object needs sql\/udfs\/brand_new\/\Q$development\E\.sql too/);

fails_with('a snapshot of no version', sub {
	my ($sql) = @_;
	copy("$sql/$function/latest.sql", "$sql/$function/9.9.9.sql");
}, qr/sql\/udfs\/retry_period\/9\.9\.9\.sql: neither latest\.sql nor the snapshot of a version/);

fails_with('an object left out of the install', sub {
	my ($sql) = @_;
	spew("$sql/install/75_dispatch_operations.sql", slurp("$sql/install/75_dispatch_operations.sql") =~ s/^\\ir \.\.\/udfs\/retry_period\/latest\.sql\n//mr);
}, qr/sql\/install\/\*\.sql: never includes sql\/udfs\/retry_period\/latest\.sql/);

fails_with('the install includes a snapshot', sub {
	my ($sql) = @_;
	spew("$sql/install/75_dispatch_operations.sql",
		slurp("$sql/install/75_dispatch_operations.sql") =~ s/udfs\/retry_period\/latest\.sql/udfs\/retry_period\/$release.sql/r);
}, qr/sql\/install\/75_dispatch_operations\.sql:\d+: includes udfs\/retry_period\/\Q$release\E\.sql: the install under development includes latest\.sql, never a snapshot/);

fails_with('the install includes a file that is not there', sub {
	my ($sql) = @_;
	spew("$sql/install/99_new.sql", "\\ir ../udfs/not_there/latest.sql\n");
}, qr/sql\/install\/99_new\.sql:1: includes sql\/udfs\/not_there\/latest\.sql, which does not exist/);

fails_with('an object included twice', sub {
	my ($sql) = @_;
	spew("$sql/install/99_new.sql", "\\ir ../udfs/retry_period/latest.sql\n");
}, qr/sql\/install\/99_new\.sql:1: includes udfs\/retry_period a second time/);

fails_with('a function written out in the install', sub {
	my ($sql) = @_;
	spew("$sql/install/99_new.sql", "CREATE FUNCTION billguard.typed_in() RETURNS int LANGUAGE sql RETURN 1;\n");
}, qr/sql\/install\/99_new\.sql:1: a definition outside sql\/udfs\/ or sql\/views\/: CREATE FUNCTION billguard\.typed_in/);

fails_with('a view written out in an upgrade', sub {
	my ($sql) = @_;
	spew("$sql/$upgrade", slurp("$sql/$upgrade") . "CREATE OR REPLACE VIEW billguard.typed_in AS SELECT 1;\n");
}, qr/\Q$upgrade\E:\d+: a definition outside sql\/udfs\/ or sql\/views\/: CREATE OR REPLACE VIEW/);

fails_with('a function of an upgrade\'s own that it never drops', sub {
	my ($sql) = @_;
	spew("$sql/$upgrade", slurp("$sql/$upgrade") . "CREATE FUNCTION billguard.helper() RETURNS int LANGUAGE sql RETURN 1;\n");
}, qr/\Q$upgrade\E:\d+: a definition outside sql\/udfs\/ or sql\/views\/: CREATE FUNCTION billguard\.helper/);

fails_with('a function of an upgrade\'s own named as a function of sql/udfs', sub {
	my ($sql) = @_;
	spew("$sql/$upgrade", slurp("$sql/$upgrade")
		. "CREATE FUNCTION billguard.retry_period() RETURNS int LANGUAGE sql RETURN 1;\nDROP FUNCTION billguard.retry_period();\n");
}, qr/\Q$upgrade\E:\d+: a definition outside sql\/udfs\/ or sql\/views\/: CREATE FUNCTION billguard\.retry_period\(\)/);

($status, $said) = check_broken(sub {
	my ($sql) = @_;
	spew("$sql/$upgrade", slurp("$sql/$upgrade")
		. "CREATE FUNCTION billguard.helper() RETURNS int LANGUAGE sql RETURN 1;\nDROP FUNCTION billguard.helper();\n");
});
is($status, 0, 'a function of an upgrade\'s own that it drops again passes') or diag($said);

fails_with('a file that defines another object than its directory', sub {
	my ($sql) = @_;
	for my $file ('latest.sql', "$release.sql") {
		spew("$sql/$function/$file", slurp("$sql/$function/$file") . "CREATE OR REPLACE FUNCTION billguard.stowaway() RETURNS int LANGUAGE sql RETURN 1;\n");
	}
}, qr/sql\/udfs\/retry_period\/latest\.sql defines function billguard\.stowaway: it holds function billguard\.retry_period only/);

# A change made as the rules want it: a snapshot of the development
# version, the same as latest.sql, included by the upgrade to it.
sub change_retry_period {
	my ($sql, $include) = @_;
	my $text = slurp("$sql/$function/latest.sql") . "-- changed in $development\n";
	spew("$sql/$function/latest.sql", $text);
	spew("$sql/$function/$development.sql", $text);
	spew("$sql/$upgrade", slurp("$sql/$upgrade") . "$include\n") if defined $include;
}

($status, $said) = check_broken(sub { change_retry_period($_[0], "\\ir udfs/retry_period/$development.sql") });
is($status, 0, 'a change made as the rules want it passes') or diag($said);

fails_with('a changed function the upgrade does not include', sub {
	change_retry_period($_[0]);
}, qr/\Q$upgrade\E: never includes sql\/udfs\/retry_period\/\Q$development\E\.sql, so an updated database would not have what a fresh \Q$development\E install has/);

fails_with('an upgrade that includes latest.sql', sub {
	change_retry_period($_[0], '\\ir udfs/retry_period/latest.sql');
}, qr/\Q$upgrade\E:\d+: includes udfs\/retry_period\/latest\.sql: the upgrade to \Q$development\E includes snapshots of \Q$development\E only \(latest\.sql changes after the release/);

fails_with('an upgrade that includes a snapshot of another version', sub {
	change_retry_period($_[0], "\\ir udfs/retry_period/$development.sql\n\\ir udfs/period_status/$release.sql");
}, qr/\Q$upgrade\E:\d+: includes udfs\/period_status\/\Q$release\E\.sql: the upgrade to \Q$development\E includes snapshots of \Q$development\E only/);

fails_with('an upgrade that includes a snapshot twice', sub {
	change_retry_period($_[0], "\\ir udfs/retry_period/$development.sql\n\\ir udfs/retry_period/$development.sql");
}, qr/\Q$upgrade\E:\d+: includes udfs\/retry_period a second time/);

fails_with('no upgrade into the version under development', sub {
	unlink "$_[0]/$upgrade" or die $!;
}, qr/no upgrade into \Q$development\E: sql\/\Q$upgrade\E is missing/);

fails_with('an upgrade from the wrong version', sub {
	my ($sql) = @_;
	rename "$sql/$upgrade", "$sql/billguard--0.1.0--$development.sql.in" or die $!;
}, qr/billguard--0\.1\.0--\Q$development\E\.sql\.in: the upgrade into \Q$development\E starts from \Q$release\E, the version before it/);

fails_with('a snapshot of the first release that it does not hold', sub {
	my ($sql) = @_;
	for my $file ('latest.sql', '0.1.0.sql') {
		spew("$sql/udfs/bill_customer/$file", slurp("$sql/udfs/bill_customer/$file") =~ s/\bIF\b/if/r);
	}
}, qr/sql\/udfs\/bill_customer\/0\.1\.0\.sql does not appear verbatim in sql\/billguard--0\.1\.0\.sql/);

fails_with('a released install that includes an older snapshot than it had', sub {
	my ($sql) = @_;
	copy("$sql/$function/$release.sql", "$sql/$function/0.1.0.sql");
	spew("$sql/billguard--$release.sql.in",
		slurp("$sql/billguard--$release.sql.in") =~ s/udfs\/retry_period\/\Q$release\E\.sql/udfs\/retry_period\/0.1.0.sql/r);
}, qr/billguard--\Q$release\E\.sql\.in:\d+: includes udfs\/retry_period\/0\.1\.0\.sql, but the install of \Q$release\E holds \Q$release\E\.sql/);

fails_with('a function in the install with no upgrade path', sub {
	my ($sql) = @_;
	# Unchanged since the last release, by its snapshots, yet not in that release's install.
	spew("$sql/billguard--$release.sql.in",
		slurp("$sql/billguard--$release.sql.in") =~ s/^\\ir udfs\/due_periods\/\Q$release\E\.sql\n//mr);
}, qr/udfs\/due_periods is in the install of \Q$development\E, unchanged since an earlier version, but not in the install of \Q$release\E: no upgrade path creates it/);

fails_with('a released install changed', sub {
	my ($sql) = @_;
	spew("$sql/billguard--0.1.0.sql", slurp("$sql/billguard--0.1.0.sql") =~ s/Pre-flight claims/Pre-flight claim/r);
}, qr/sql\/billguard--0\.1\.0\.sql is not the script released: its sha256 is [0-9a-f]{64}, sql\/released\.sha256 says/);

fails_with('a released upgrade changed', sub {
	my ($sql) = @_;
	my $frozen = (glob("$sql/billguard--*--$release.sql.in"))[0];
	spew($frozen, slurp($frozen) . "-- a line more\n");
}, qr/sql\/billguard--[\d.]+--\Q$release\E\.sql is not the script released/);

fails_with('a released snapshot changed', sub {
	my ($sql) = @_;
	my $text = slurp("$sql/$function/$release.sql") . "-- changed after its release\n";
	spew("$sql/$function/$release.sql", $text);
	spew("$sql/$function/latest.sql", $text);
}, qr/sql\/billguard--\Q$release\E\.sql is not the script released/);

fails_with('a released script without its hash', sub {
	my ($sql) = @_;
	spew("$sql/released.sha256", slurp("$sql/released.sha256") =~ s/^.*  billguard--\Q$release\E\.sql\n//mr);
}, qr/sql\/billguard--\Q$release\E\.sql, a released script, has no line in sql\/released\.sha256/);

fails_with('a released version that moves on without a new EXTVERSION', sub {
	my ($sql) = @_;
	my $makefile = dirname($sql) . '/Makefile';
	spew($makefile, slurp($makefile) =~ s/^EXTVERSION\s*=.*$/EXTVERSION = $release/mr);
}, qr/the version under development, \Q$release\E, has a frozen install/);

done_testing();
