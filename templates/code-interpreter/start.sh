#!/bin/sh
# The template's start command (run by berth on every boot, as the sandbox's
# user "user"): berth's code-interpreter server on :49999, restarted if it
# ever exits so a crashed server does not leave the sandbox without one.
cd "${HOME:-/home/user}" 2>/dev/null || cd /
while :; do
	/usr/bin/python3 /opt/berth/code-interpreter/server.py
	echo "code interpreter exited ($?); restarting" >&2
	sleep 0.5
done
