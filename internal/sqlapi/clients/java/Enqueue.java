// The Java client test (internal/sqlapi): the PostgreSQL JDBC driver, run as
// a single source file (java -cp postgresql.jar Enqueue.java). Connection
// from PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD. Prints one line per
// step for the Go test.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import org.postgresql.util.PSQLException;

public class Enqueue {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/" + System.getenv("PGDATABASE");
        String password = System.getenv("PGPASSWORD") == null ? "" : System.getenv("PGPASSWORD");
        String schema = "\"" + System.getenv("PGWAKE_SCHEMA").replace("\"", "\"\"") + "\"";
        String queue = System.getenv("PGWAKE_QUEUE");
        int jobs = Integer.parseInt(System.getenv("PGWAKE_JOBS"));
        int gap = Integer.parseInt(System.getenv("PGWAKE_GAP_MS"));
        try (Connection c = DriverManager.getConnection(url, System.getenv("PGUSER"), password)) {
            c.setAutoCommit(false);
            PreparedStatement insert = c.prepareStatement("INSERT INTO " + schema + ".orders (note) VALUES (?)");
            PreparedStatement enqueue = c.prepareStatement("SELECT " + schema + ".enqueue(?, ?::jsonb, queue => ?, priority => ?)");

            // Rolled back: the order and the job go together.
            insert.setString(1, "java rollback");
            insert.executeUpdate();
            long id = enqueue(enqueue, "{\"client\": \"java\"}", queue, 0);
            c.rollback();
            System.out.println("rolledback " + id);

            for (int n = 0; n < jobs; n++) {
                insert.setString(1, "java " + n);
                insert.executeUpdate();
                id = enqueue(enqueue, "{\"client\": \"java\", \"n\": " + n + "}", queue, 0);
                long commitUs = ChronoUnit.MICROS.between(Instant.EPOCH, Instant.now());
                c.commit();
                System.out.println("committed " + id + " " + commitUs);
                Thread.sleep(gap);
            }

            // A priority outside smallint: PW004.
            try {
                enqueue(enqueue, "{}", queue, 40000);
            } catch (SQLException e) {
                System.out.println("sqlstate " + e.getSQLState() + " " + ((PSQLException) e).getServerErrorMessage().getColumn());
                c.rollback();
            }
        }
    }

    static long enqueue(PreparedStatement ps, String payload, String queue, int priority) throws SQLException {
        ps.setString(1, "sqlapi.test");
        ps.setString(2, payload);
        ps.setString(3, queue);
        ps.setInt(4, priority);
        try (ResultSet rs = ps.executeQuery()) {
            rs.next();
            return rs.getLong(1);
        }
    }
}
