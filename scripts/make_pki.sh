#!/usr/bin/env bash
# Makes everything a secured mptrain cluster needs, with openssl, into DIR:
#   ca.pem                        the cluster's certificate authority (its certificate)
#   ca-private/ca.key             the CA's private key, in a directory of its own (mode 0700), so
#                                 that nothing installing DIR/*.key or DIR/* for a service hands
#                                 it over: with it anyone mints a worker's or a user's
#                                 certificate. Keep it off the cluster's machines.
#   server.pem server.key         the coordinator's certificate (SAN: localhost, 127.0.0.1, and
#                                 every HOST given after DIR: names or IP addresses)
#   client.pem client.key         a client certificate for users (trainctl, curl): its subject
#                                 CN "mptrain client" names no worker, so it registers none
#   NAME.pem NAME.key NAME.token  per worker NAME (--worker NAME, repeated; default w0 w1 w2 w3):
#                                 its client certificate, subject CN = NAME, and its token, whose
#                                 principal is NAME. The coordinator registers a worker only
#                                 under the name both of its credentials name (README, Security)
#   tokens                        the coordinator's --token_file (ROLE PRINCIPAL TOKEN a line)
#   admin.token alice.token bob.token viewer.token
#                                 one client --token_file per principal (roles admin, user,
#                                 user, viewer)
#   other-ca.pem                  an unrelated CA (tests: a client trusting it must fail)
# Keys and tokens are created mode 0600.
# Usage: scripts/make_pki.sh [--worker NAME]... DIR [HOST...]
set -euo pipefail
usage() { echo "usage: $0 [--worker NAME]... DIR [HOST...]" >&2; exit 2; }
workers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --worker)
      [ $# -ge 2 ] || usage
      # A worker name (coordinator: [A-Za-z0-9._:@-]) that is also a token principal (no ':'),
      # and not the name of another file here.
      if ! [[ $2 =~ ^[A-Za-z0-9._@-]{1,64}$ ]] ||
         [[ $2 =~ ^(ca|server|client|admin|alice|bob|viewer|other-ca|tokens)$ ]]; then
        echo "$0: --worker $2: want 1 to 64 characters of [A-Za-z0-9._@-], not a file name" \
             "this script uses" >&2
        exit 2
      fi
      workers+=("$2"); shift 2 ;;
    --*) usage ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ]; then usage; fi
if [ ${#workers[@]} -eq 0 ]; then workers=(w0 w1 w2 w3); fi
dir=$1; shift
mkdir -p "$dir"
cd "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for host in "$@"; do
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
done

ec_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }

make_ca() {  # name subject (its key in ca-private/)
  mkdir -p ca-private
  chmod 0700 ca-private
  ec_key "ca-private/$1.key"
  openssl req -x509 -new -key "ca-private/$1.key" -sha256 -days 3650 -subj "$2" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

sign() {  # name subject extensions
  ec_key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-private/ca.key -CAcreateserial \
    -CAserial ca-private/ca.srl -sha256 -days 825 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

make_ca ca "/CN=mptrain cluster CA"
make_ca other-ca "/CN=some other CA"
rm -f ca-private/other-ca.key
sign server "/CN=mptrain coordinator" \
  "subjectAltName=$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment"
client_extensions="extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"
sign client "/CN=mptrain client" "$client_extensions"
for name in "${workers[@]}"; do sign "$name" "/CN=$name" "$client_extensions"; done

token() { openssl rand -hex 24; }
{
  echo "# ROLE PRINCIPAL TOKEN"
  for line in "admin admin" "user alice" "user bob" "viewer viewer"; do
    set -- $line
    value=$(token)
    echo "$1 $2 $value"
    echo "$value" > "$2.token"
  done
  # Each worker its own: a worker token registers only the worker its principal names.
  for name in "${workers[@]}"; do
    value=$(token)
    echo "worker $name $value"
    echo "$value" > "$name.token"
  done
} > tokens
chmod 0644 ca.pem other-ca.pem server.pem client.pem
for name in "${workers[@]}"; do chmod 0644 "$name.pem"; done
