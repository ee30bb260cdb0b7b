#!/usr/bin/perl
# Runs every ```sql block of the given Markdown pages, in the order written,
# and compares each block's output with the ```output block right after it.
#
# One psql session per page, on a fresh database, so a page reads like a psql
# session a reader types in order.  Unless the page runs CREATE EXTENSION
# status_history itself (the front page's quick start does), the extension is
# created first, as the superuser the connection uses.  psql runs with -q
# (no command tags) and the output is stdout and stderr together, as
# pg_regress keeps it; psql's "psql:FILE:N: " prefix of messages is cut.
# A block with no ```output block after it must print no message psql
# prefixes with its input line (errors and warnings of the server or of psql
# itself; NOTICE and INFO are allowed).  A statement is ended (;) at its
# block's end.  Fences GitHub shows as SQL but named otherwise, and ~~~
# fences, are refused, so that nothing that looks like SQL goes unrun.  Roles a page
# creates are dropped after it with its database.  Blocks fenced otherwise
# (```sh, ```text, ...) are not run.
#
# Usage (a server reachable through PGHOST/PGPORT/PGUSER): test/docs.pl PAGE.md...
# Exits non-zero when any block failed; prints the differences.
use strict;
use warnings;

my $failed = 0;

# Split a page into its sql blocks, each with the output block after it, if any.
sub blocks_of {
    my ($page) = @_;
    open(my $fh, '<', $page) or die "$page: $!\n";
    my @lines = <$fh>;
    close $fh;
    my (@blocks, $info, $indent, @body, $start);
    my $since_sql = 99;    # lines since the last sql block closed
    for my $n (0 .. $#lines) {
        my $l = $lines[$n];
        if (!defined $info) {
            die "$page:" . ($n + 1) . ": a ~~~ fence: write ``` (only those are run or skipped knowingly)\n"
                if $l =~ /^\s*~~~/;
            if ($l =~ /^(\s*)```\s*(\S*)(.*)$/) {
                my ($word, $rest) = ($2, $3);
                ($indent, $info, $start) = ($1, lc $word, $n + 1);
                # A fence GitHub shows as SQL must be one this runs (or output).
                die "$page:$start: fence ```$word$rest: write ```sql (run) or ```text (not run)\n"
                    if ($info =~ /^(sql|psql|pgsql|postgres|postgresql|plpgsql)/ || $info eq 'output')
                        && ($rest =~ /\S/ || ($info ne 'sql' && $info ne 'output'));
                @body = ();
            } elsif ($l !~ /^\s*$/) {
                $since_sql = 99;    # prose between: an output block no longer belongs
            }
            next;
        }
        if ($l =~ /^\s*```\s*$/) {
            my $text = join('', @body);
            if ($info eq 'sql') {
                push @blocks, { line => $start, sql => $text };
                $since_sql = 0;
            } elsif ($info eq 'output') {
                die "$page:$start: an output block that follows no sql block\n"
                    if $since_sql != 0 || !@blocks || defined $blocks[-1]{expected};
                $blocks[-1]{expected} = $text;
            } else {
                $since_sql = 99;
            }
            undef $info;
            next;
        }
        $l =~ s/^\Q$indent\E//;
        push @body, $l;
    }
    die "$page: a fence opened at line $start is never closed\n" if defined $info;
    return @blocks;
}

# Trailing blanks and blank lines do not count.
sub normalize {
    my ($t) = @_;
    $t =~ s/[ \t]+$//mg;
    $t =~ s/\n+\z//;
    $t =~ s/^\n+//;
    return "$t\n";
}

sub psql_admin_in {
    my ($db, $sql) = @_;
    my $out = `psql -X -q -At -d $db -v ON_ERROR_STOP=1 -c '$sql' 2>&1`;
    die "psql: $sql: $out" if $?;
    return $out;
}
sub psql_admin { return psql_admin_in('postgres', @_); }

for my $page (@ARGV) {
    my @blocks = blocks_of($page);
    if (!@blocks) { print "ok   $page (no sql blocks)\n"; next; }
    (my $db = lc "docs_$page") =~ s/[^a-z0-9]+/_/g;
    my %roles_before = map { $_ => 1 } split /\n/, psql_admin('SELECT rolname FROM pg_roles');
    psql_admin("DROP DATABASE IF EXISTS $db");
    psql_admin("CREATE DATABASE $db");
    psql_admin_in($db, 'CREATE EXTENSION status_history')
        unless grep { $_->{sql} =~ /CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?status_history\b/i } @blocks;

    # One script, a marker echoed before each block, run as one session.
    my $script = "\\set ON_ERROR_STOP 0\n";
    for my $i (0 .. $#blocks) {
        $script .= "\\echo '\@\@block $i\@\@'\n" . $blocks[$i]{sql};
        # A statement left without its ';' ends here, failing in its own block.
        $script .= "\n;\n";
    }
    $script .= "\\echo '\@\@end\@\@'\n";
    # From a file, so that psql prefixes its messages with the input line.
    my $file = "/tmp/sh_docs_$$.sql";
    open(my $sf, '>', $file) or die "$file: $!\n";
    print $sf $script;
    close $sf;
    open(my $ps, '-|', 'sh', '-c', "psql -X -q -d $db -f $file 2>&1") or die "psql: $!\n";
    my $all = do { local $/; <$ps> };
    close $ps;
    unlink $file;
    # Messages psql prefixes (from the server or psql itself, but NOTICE and
    # INFO) are failures unless an output block shows them.
    $all =~ s/^psql:\Q$file\E:\d+: (?!NOTICE:|INFO:)/\@\@msg\@\@/mg;
    $all =~ s/^psql:\Q$file\E:\d+: //mg;
    my $ended = $all =~ /^\@\@end\@\@\n\z/m;
    my @parts = split /^\@\@block (\d+)\@\@\n/m, $all;
    my %got;
    for (my $k = 1; $k < @parts; $k += 2) { $got{$parts[$k]} = $parts[$k + 1]; }
    $got{$#blocks} =~ s/^\@\@end\@\@\n.*//ms if defined $got{$#blocks};
    my %failed_msg = map { $_ => scalar($got{$_} =~ /^\@\@msg\@\@/m) } keys %got;
    s/^\@\@msg\@\@//mg for values %got;

    my $bad = 0;
    for my $i (0 .. $#blocks) {
        my $b = $blocks[$i];
        my $out = defined $got{$i} ? $got{$i} : "(no output: the session ended before this block)\n";
        if (defined $b->{expected}) {
            next if normalize($out) eq normalize($b->{expected});
            print "FAIL $page:$b->{line}: output differs\n--- shown\n", normalize($b->{expected}),
                "+++ printed\n", normalize($out);
            $bad++;
        } elsif ($failed_msg{$i} || !defined $got{$i}) {
            print "FAIL $page:$b->{line}: the block printed an error or warning and no output block shows it\n$out";
            $bad++;
        }
    }
    if (!$ended) {
        print "FAIL $page: the session did not reach the page's end, or printed after it\n";
        $bad++;
    }
    psql_admin("DROP DATABASE $db");
    for my $r (split /\n/, psql_admin('SELECT rolname FROM pg_roles')) {
        psql_admin(qq{DROP ROLE "$r"}) unless $roles_before{$r};
    }
    printf "%s %s (%d sql blocks, %d with output shown)\n", $bad ? 'FAIL' : 'ok  ', $page,
        scalar @blocks, scalar grep { defined $_->{expected} } @blocks;
    $failed += $bad;
}
exit($failed ? 1 : 0);
