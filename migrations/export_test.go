package migrations

// UpTo is Up applying migrations up to version limit only.
var UpTo = up
