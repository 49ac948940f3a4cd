# Runs every C++ unit test program (test/unit/*_test.cpp), built by `make
# unit` twice: plain, and with AddressSanitizer and UndefinedBehaviorSanitizer.
# Each prints TAP; a sanitizer report aborts the program, which fails here.
use strict;
use warnings;
use Test::More;

my @programs = map { glob(".build/$_/*_test") } qw(unit asan/unit);
my @sources = glob('test/unit/*_test.cpp');
is(scalar(@programs), 2 * scalar(@sources), 'every unit test is built plain and sanitized')
  or diag('run `make unit` first');
for my $program (@programs) {
	my $output = qx{ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $program 2>&1};
	my $status = $?;
	my @failed = grep { /^not ok/ } split /\n/, $output;
	my $passed = () = $output =~ /^ok /mg;
	ok($status == 0 && !@failed && $passed > 0, "$program: $passed passed")
	  or diag("exit status $status\n$output");
}
done_testing();
