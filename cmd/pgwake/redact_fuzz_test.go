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
	for _, s := range []string{"s3cretPW", "hunter22", "Zx9Zx9Zx9"} {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
		f.Add(s, uint8(2))
		f.Add(s, uint8(3))
		f.Add(s, uint8(4))
		f.Add(s, uint8(5))
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
		var s string
		switch form % 6 {
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
		}
		if got := redactURL(s); strings.Contains(got, pass) {
			t.Fatalf("redactURL(%q) = %q: the password shows", s, got)
		}
	})
}
