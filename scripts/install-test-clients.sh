#!/usr/bin/env bash
# Installs the PostgreSQL clients that internal/sqlapi's tests drive (docs/sql.md):
# psql, Python psycopg 3, Ruby pg, Node pg (npm, from the committed lock file)
# and the PostgreSQL JDBC driver with a JDK; and chromium, the headless browser
# the dashboard's browser tests drive (ui/browser_test.go). Idempotent: installs only what is
# missing. Debian packages need root and apt-get; without them the script says
# what it could not install and the tests that need it skip with that reason.
# Never fails the build: a missing client is reported by its test as a skip.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

want=()
for pkg in postgresql-client python3 python3-psycopg ruby ruby-pg nodejs npm default-jdk-headless libpostgresql-jdbc-java chromium; do
	case "$pkg" in
	nodejs | npm) command -v "$pkg" >/dev/null 2>&1 && continue ;; # may come from another repository
	default-jdk-headless) command -v javac >/dev/null 2>&1 && continue ;;
	chromium) command -v chromium >/dev/null 2>&1 && continue ;;
	esac
	have_deb "$pkg" || want+=("$pkg")
done

if ((${#want[@]} > 0)); then
	if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "install-test-clients: installing ${want[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq || echo "install-test-clients: apt-get update failed" >&2
		# One by one: a package that cannot be had leaves the others installed.
		for pkg in "${want[@]}"; do
			apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null ||
				echo "install-test-clients: could not install $pkg; its tests will skip" >&2
		done
	else
		echo "install-test-clients: not root or no apt-get; missing: ${want[*]} (their tests will skip)" >&2
	fi
fi

if command -v npm >/dev/null 2>&1; then
	dir=internal/sqlapi/clients/node
	# The stamp is the lock file npm ci last installed: nothing to do while it
	# matches.
	if [[ ! -d "$dir/node_modules/pg" ]] || ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.pgwake-installed-lock" 2>/dev/null; then
		echo "install-test-clients: npm ci in $dir"
		if (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error); then
			cp "$dir/package-lock.json" "$dir/node_modules/.pgwake-installed-lock"
		else
			echo "install-test-clients: npm ci failed; the Node test will skip" >&2
		fi
	fi
else
	echo "install-test-clients: no npm; the Node test will skip" >&2
fi
exit 0
