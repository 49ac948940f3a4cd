# The grants README.md documents under "Privileges" are the grants
# test/pgtap/09_privileges.sql runs, so the documented grants are the tested
# ones: the pgTAP test proves
# that they work as written only while the two say the same, to the letter.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = $ENV{BILLGUARD_ROOT};
my $readme = slurp_file("$root/README.md");
my $pgtap = slurp_file("$root/test/pgtap/09_privileges.sql");

my ($documented) = $readme =~ /^## Privileges\n.*?^```sql\n(.*?)^```\n/ms;
my ($tested) = $pgtap =~ /^-- README grants: begin\n(.*?)^-- README grants: end\n/ms;
ok(defined $documented, 'README.md has an sql block under "## Privileges"');
ok(defined $tested, '09_privileges.sql marks the README grants');
like($documented // '', qr/TO billing_app;.*TO billing_accounts;.*TO billing_ops;/s,
	'the README grants cover the application, the accounts maintainer and the operator');
is($tested, $documented, 'the grants the pgTAP test runs are the README grants, verbatim');

done_testing();
