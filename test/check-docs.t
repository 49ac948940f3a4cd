#!/usr/bin/env perl
# test/check-docs.pl on copies of the repository's documents and sources,
# each broken in one way: it passes on the repository as it is and fails,
# saying why, on every break of one of its rules.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Find qw(find);
use File::Path qw(make_path remove_tree);
use File::Temp qw(tempdir);
use Cwd qw(abs_path);
use Test::More;

my $repo  = abs_path(dirname(__FILE__) . '/..');
my $check = "$repo/test/check-docs.pl";
my $work  = tempdir(CLEANUP => 1);

sub slurp { my ($path) = @_; open my $fh, '<', $path or die "$path: $!"; local $/; scalar <$fh> }
sub spew { my ($path, $text) = @_; make_path(dirname($path)); open my $fh, '>', $path or die "$path: $!"; print $fh $text }

sub edit {
	my ($path, $change) = @_;
	local $_ = slurp($path);
	$change->();
	spew($path, $_);
}

# A copy of what check-docs reads: the documents, the C++ of extension/, the
# SQL sources, what the documents link to.
my $copies = 0;
sub copy_of_repository {
	my $root = "$work/copy" . ++$copies;
	find({ no_chdir => 1, wanted => sub {
		return if $_ eq $repo;
		my $file = substr($_, length($repo) + 1);
		$File::Find::prune = 1 if -d && $file =~ m{(?:^|/)(?:\.git|\.build|node_modules)$};
		return unless -f && $file =~ m{\.(?:md|cpp|hpp|h|sql|in)$};
		return unless $file =~ m{^(?:[^/]+\.md|docs/|extension/|sql/|worker/|tools/)};
		spew("$root/$file", slurp($_));
	} }, $repo);
	return $root;
}

# check-docs on a copy broken by $break: its exit status and what it said.
sub check_broken {
	my ($break) = @_;
	my $root = copy_of_repository();
	$break->($root);
	my @run = (scalar `'$^X' '$check' '$root' 2>&1`, $? >> 8);
	remove_tree($root);
	return reverse @run;
}

sub fails_with {
	my ($what, $break, $expected) = @_;
	my ($status, $said) = check_broken($break);
	isnt($status, 0, "$what: check-docs fails");
	like($said, $expected, "$what: and says why") or diag($said);
}

my ($status, $said) = check_broken(sub { });
is($status, 0, 'the repository as it is passes') or diag($said);

fails_with('a link to a file that does not exist',
	sub { edit("$_[0]/docs/operations.md", sub { s/\(configuration\.md\)/(configurations.md)/ }) },
	qr{docs/operations\.md:\d+: the link to configurations\.md leads to no file});
fails_with('a link to a heading that does not exist',
	sub { edit("$_[0]/README.md", sub { s/\(docs\/operations\.md#upgrading-the-extension\)/(docs\/operations.md#upgrading)/ }) },
	qr{README\.md:\d+: the link to docs/operations\.md#upgrading names no heading});
fails_with('a renamed heading that a link names',
	sub { edit("$_[0]/docs/privileges.md", sub { s/^## The proxy's role$/## The proxy role/m }) },
	qr{the link to privileges\.md#the-proxys-role names no heading});
fails_with('a setting the C++ defines without a row in configuration.md',
	sub { edit("$_[0]/docs/configuration.md", sub { s/^\| `billguard\.poll_interval` \|.*\n//m }) },
	qr{billguard\.poll_interval is defined in extension/ but has no row});
fails_with('a setting new in the C++, not documented',
	sub {
		spew("$_[0]/extension/settings/new_setting.cpp",
			qq{void Define() {\n  DefineCustomIntVariable(\n      "billguard.new_knob", "A knob.", nullptr, &knob, 1, 0, 9,\n      PGC_SIGHUP, 0, nullptr, nullptr, nullptr);\n}\n});
	},
	qr{billguard\.new_knob is defined in extension/ but has no row});
fails_with('a documented setting the C++ no longer defines',
	sub { edit("$_[0]/docs/configuration.md", sub { s/^(\| `billguard\.poll_interval` \|.*\n)/$1| `billguard.gone` | 1 | sighup | server configuration | Gone. |\n/m }) },
	qr{billguard\.gone has a row but extension/ defines no such setting});
fails_with('a setting documented twice',
	sub { edit("$_[0]/docs/configuration.md", sub { s/^(\| `billguard\.poll_interval` \|.*\n)/$1$1/m }) },
	qr{billguard\.poll_interval has 2 rows, not one});
fails_with('a function of sql/udfs that sql-api.md does not name',
	sub { spew("$_[0]/sql/udfs/brand_new_function/latest.sql", "-- new\n") },
	qr{docs/sql-api\.md: names no function or view brand_new_function});
fails_with('a citation of the tracker',
	sub { edit("$_[0]/docs/design.md", sub { s/^# Design\n/# Design\n\nAs issue 14 asked.\n/ }) },
	qr{docs/design\.md: cites the tracker \("issue 14"\)});

done_testing();
