#!/bin/sh
# nsrsh.sh HOST COMMAND...: the remote shell of netns_test.sh's --hostfile steps, what ssh is to
# lspawn there: runs COMMAND (its words joined with blanks, as ssh joins them) with sh -c on HOST,
# one of the test's network namespaces, with its own host name; stdin, stdout, stderr and the exit
# status pass through. NSRSH_HOSTS="ADDR=NETNS=HOSTNAME ..." maps the hosts. A host not in it is
# unreachable: ssh's message and exit status 255.
host=$1
shift
for entry in $NSRSH_HOSTS; do
  addr=${entry%%=*}
  rest=${entry#*=}
  if [ "$addr" = "$host" ]; then
    exec nsenter --net=/run/netns/"${rest%%=*}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "${rest#*=}" "$*"
  fi
done
echo "ssh: connect to host $host port 22: No route to host" >&2
exit 255
