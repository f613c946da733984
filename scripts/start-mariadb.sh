#!/usr/bin/env bash
# Make sure a MariaDB answers on 127.0.0.1:3306 for the `mysql` tests; start it if not.
# Installs Debian's mariadb-server when it is missing (needs root). Binds to loopback only.
# Point the tests at another server instead with DART_RAY_TEST_MYSQL_DSN (then this exits).
set -euo pipefail

if [ -n "${DART_RAY_TEST_MYSQL_DSN:-}" ]; then
  echo "start-mariadb: using DART_RAY_TEST_MYSQL_DSN"
  exit 0
fi

answers() { mariadb-admin --protocol=tcp -h127.0.0.1 -P3306 -uroot ping >/dev/null 2>&1; }
# `ping` succeeds even when access is denied (the server is up); check a real login too.
logs_in() { mariadb --protocol=tcp -h127.0.0.1 -P3306 -uroot -e "SELECT 1" >/dev/null 2>&1; }

if command -v mariadb-admin >/dev/null && answers; then
  echo "start-mariadb: MariaDB answers on 127.0.0.1:3306"
  logs_in || [ -s "${XDG_CONFIG_HOME:-$HOME/.config}/dart-ray/test-mysql-dsn" ] || \
    echo "start-mariadb: warning: root cannot log in over TCP; set DART_RAY_TEST_MYSQL_DSN" >&2
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "start-mariadb: nothing answers on 127.0.0.1:3306 and I am not root;" \
       "start MariaDB yourself or set DART_RAY_TEST_MYSQL_DSN" >&2
  exit 1
fi

if [ ! -x /usr/sbin/mariadbd ]; then
  echo "start-mariadb: installing mariadb-server"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
fi

mkdir -p /run/mysqld
chown mysql:root /run/mysqld
start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
  --user=mysql --bind-address=127.0.0.1 --port=3306

dsn_file="${XDG_CONFIG_HOME:-$HOME/.config}/dart-ray/test-mysql-dsn"
for _ in $(seq 1 60); do
  if logs_in; then
    echo "start-mariadb: started MariaDB on 127.0.0.1:3306"
    exit 0
  fi
  # A fresh Debian install lets root in only through the socket. Then make a test account
  # with a random password and leave its DSN in a private file the tests read; no password
  # is ever fixed in the repository.
  if mariadb -uroot -e "SELECT 1" >/dev/null 2>&1; then
    pw=$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
    mariadb -uroot -e "CREATE OR REPLACE USER 'dart_test'@'127.0.0.1' IDENTIFIED BY '$pw';
      GRANT ALL PRIVILEGES ON *.* TO 'dart_test'@'127.0.0.1' WITH GRANT OPTION;"
    mkdir -p "$(dirname "$dsn_file")"
    (umask 077; echo "mysql+pymysql://dart_test:$pw@127.0.0.1:3306" > "$dsn_file")
    echo "start-mariadb: started MariaDB; test DSN written to $dsn_file"
    exit 0
  fi
  sleep 1
done
echo "start-mariadb: MariaDB did not come up on 127.0.0.1:3306" >&2
exit 1
