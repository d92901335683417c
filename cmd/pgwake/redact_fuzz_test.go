package main

import (
	"strings"
	"testing"
	"unicode"
)

// FuzzRedactURL builds connection strings in every form pgx accepts around
// a password and checks that redactURL, which every error message about a
// connection string goes through, never lets the password through.
func FuzzRedactURL(f *testing.F) {
	const forms = 10
	for _, s := range []string{"s3cretPW", "hunter22", "Zx9Zx9Zx9"} {
		for form := range uint8(forms) {
			f.Add(s, form)
		}
	}
	f.Fuzz(func(t *testing.T, pass string, form uint8) {
		if len(pass) < 6 || len(pass) > 64 {
			return
		}
		for _, r := range pass {
			if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r)) {
				return
			}
		}
		if strings.Contains("postgres://app@db:5432/app?sslmode=disable host=db user=app dbname=app xxxxx", pass) {
			return // the password is also a word of the rest of the string
		}
		// Forms with an escaped space split the password in two halves:
		// neither may show.
		half := len(pass) / 2
		var s string
		secrets := []string{pass}
		switch form % forms {
		case 0:
			s = "postgres://app:" + pass + "@db:5432/app?sslmode=disable"
		case 1:
			s = "host=db user=app password=" + pass + " dbname=app"
		case 2:
			s = "postgres://db:5432/app?sslmode=disable&password=" + pass
		case 3:
			s = "host=db user=app password='" + pass + "' dbname=app"
		case 4:
			s = "host=db user=app password = " + pass + " dbname=app"
		case 5:
			s = "postgresql://app:" + pass + "@db:5432,db2:5432/app"
		case 6:
			s = "host=db user=app sslpassword=" + pass + " sslkey=/k dbname=app"
		case 7:
			s = "postgres://app@db:5432/app?sslkey=/k&sslpassword=" + pass + "&sslmode=verify-full"
		case 8:
			s = "host=db user=app password=" + pass[:half] + `\ ` + pass[half:] + " dbname=app"
			secrets = []string{pass[:half], pass[half:]}
		case 9:
			s = "host=db user=app password='" + pass[:half] + ` \' ` + pass[half:] + "' dbname=app"
			secrets = []string{pass[:half], pass[half:]}
		}
		got := redactURL(s)
		for _, secret := range secrets {
			// A half may also be a word of the rest of the string.
			if strings.Contains(got, secret) && !strings.Contains(rest(s, pass, half)+" xxxxx", secret) {
				t.Fatalf("redactURL(%q) = %q: the password shows", s, got)
			}
		}
	})
}

// rest is s without the password's characters (either whole or split at
// half): what else a secret could be found in.
func rest(s, pass string, half int) string {
	for _, p := range []string{pass, pass[:half], pass[half:]} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}
