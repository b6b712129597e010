#!/usr/bin/env bash
# Makes everything a secured mptrain cluster needs, with openssl, into DIR:
#   ca.pem ca.key                 the cluster's certificate authority
#   server.pem server.key         the coordinator's certificate (SAN: localhost, 127.0.0.1, and
#                                 every HOST given after DIR: names or IP addresses)
#   client.pem client.key         a client certificate for mutual TLS (workers, trainctl)
#   tokens                        the coordinator's --token_file (ROLE PRINCIPAL TOKEN a line)
#   admin.token alice.token bob.token worker.token
#                                 one client --token_file per principal (roles admin, user,
#                                 user, worker)
#   other-ca.pem                  an unrelated CA (tests: a client trusting it must fail)
# Keys and tokens are created mode 0600. Usage: scripts/make_pki.sh DIR [HOST...]
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: $0 DIR [HOST...]" >&2; exit 2; fi
dir=$1; shift
mkdir -p "$dir"
cd "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for host in "$@"; do
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then san="$san,IP:$host"; else san="$san,DNS:$host"; fi
done

ec_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }

make_ca() {  # name subject
  ec_key "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 3650 -subj "$2" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

sign() {  # name subject extensions
  ec_key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 825 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

make_ca ca "/CN=mptrain cluster CA"
make_ca other-ca "/CN=some other CA"
rm -f other-ca.key
sign server "/CN=mptrain coordinator" \
  "subjectAltName=$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment"
sign client "/CN=mptrain client" \
  "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature,keyEncipherment"

token() { openssl rand -hex 24; }
admin=$(token); alice=$(token); bob=$(token); worker=$(token)
cat > tokens <<TOKENS
# ROLE PRINCIPAL TOKEN
admin  admin   $admin
user   alice   $alice
user   bob     $bob
worker worker  $worker
TOKENS
echo "$admin" > admin.token
echo "$alice" > alice.token
echo "$bob" > bob.token
echo "$worker" > worker.token
chmod 0644 ca.pem other-ca.pem server.pem client.pem
